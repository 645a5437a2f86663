"""CSV tables read with every row holding the header's fields: a row with more (or, where pandas stops, a broken
quote) is an error naming its file line, never a shifted or cut row.

pandas takes a first data row with one field more than the header as an index column, shifting every column, and
names the line of a parse error in its own count; ``read_csv_table`` reads with ``index_col=False`` and, when pandas
warns or stops, finds the first ragged line itself (the header is line 1).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import warnings
from typing import Any

import pandas as pd

from gridtnp.data.layout import DataError


def read_csv_table(path: str | os.PathLike[str], what: str, **kwargs: Any) -> pd.DataFrame:
    """``pd.read_csv(path, **kwargs)`` without an inferred index column; a ``DataError`` naming the first line whose
    number of fields differs from the header's (``what``: the table's kind, for the message)."""
    name = str(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            table = pd.read_csv(name, index_col=False, **kwargs)
        except (UnicodeDecodeError, pd.errors.ParserError) as err:
            raise DataError(_ragged(name, what) or _cannot_read(name, what, err)) from None
    if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
        raise DataError(_ragged(name, what) or f"{name}: a row has more fields than the header; one value a column.")
    return table


def _cannot_read(name: str, what: str, err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{name}: cannot be read as a CSV of {what} ({type(err).__name__}: {text})."


def _ragged(name: str, what: str) -> str | None:
    """The message for the first line of ``name`` with more fields than the header, or an unclosed quote; None if
    there is none."""
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rt", newline="", encoding="utf-8") as handle:
            rows = csv.reader(handle, strict=True)
            header = next(rows, None)
            if header is None:
                return None
            line = rows.line_num
            try:
                for row in rows:
                    if len(row) > len(header):
                        return (
                            f"{name}: line {line + 1} has {len(row)} fields but the header has {len(header)} "
                            f"({', '.join(header)}); one value a column in a CSV of {what} (a comma inside a value "
                            "needs quotes)."
                        )
                    line = rows.line_num
            except csv.Error:
                return f"{name}: line {line + 1} opens a quote that is never closed; fix the CSV of {what}."
    except (OSError, UnicodeDecodeError, EOFError, io.UnsupportedOperation):
        return None
    return None
