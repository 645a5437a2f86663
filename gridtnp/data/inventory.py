"""What a prepared store wrote, so that a store missing a chunk file is refused when it is opened, not read as NaN.

``gridtnp data prepare`` records, in ``attrs[CHUNKS_ATTR]``, how many chunk files each variable of the (Zarr v2,
directory) store has; ``check_chunks(path, recorded)`` counts them again when the store is opened (one directory
listing per variable) and names the missing ones. Zarr reads an absent chunk file as the fill value (NaN), so
without this a deleted or never-copied chunk silently removes data. Remote stores (URLs) are not listed.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from gridtnp.data.layout import DataError

CHUNKS_ATTR = "gridtnp_chunks"


def chunk_files(store: Path, variable: str) -> set[str]:
    """The chunk file names (``"3.0.0"``) of ``variable`` in a Zarr v2 directory store."""
    directory = store / variable
    if not directory.is_dir():
        return set()
    return {p.name for p in directory.iterdir() if not p.name.startswith(".")}


def inventory(store: Path, variables: list[str]) -> dict[str, int]:
    """``{variable: number of chunk files}`` of a Zarr v2 directory store."""
    return {v: len(chunk_files(store, v)) for v in variables}


def expected_chunks(store: Path, variable: str) -> list[str]:
    """Every chunk key of ``variable`` from its ``.zarray`` (shape and chunks), in C order."""
    meta = json.loads((store / variable / ".zarray").read_text())
    counts = [math.ceil(n / c) for n, c in zip(meta["shape"], meta["chunks"], strict=True)]
    separator = meta.get("dimension_separator", ".")
    return [separator.join(map(str, key)) for key in itertools.product(*(range(n) for n in counts))]


def check_chunks(store: Path, recorded: dict[str, int]) -> None:
    """Raise ``DataError`` naming the missing chunk files if ``store`` has fewer than ``recorded``."""
    for variable, count in recorded.items():
        present = chunk_files(store, variable)
        if len(present) >= count:
            continue
        absent = [key for key in expected_chunks(store, variable) if key not in present]
        named = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
        raise DataError(
            f"{store}: variable {variable!r} has {len(present)} of the {count} chunk files `gridtnp data prepare` "
            f"wrote; missing: {named} (chunk keys are time, ..., latitude, longitude chunk indices). The store was "
            "damaged or copied incompletely: copy it again, or re-run `gridtnp data prepare ... --overwrite`."
        )
