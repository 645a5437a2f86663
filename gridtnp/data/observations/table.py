"""Station observations in long format (one report a row), read and checked: ``read_observations``.

Columns (docs/data.md, "Station observations"): ``station_id`` (text), ``time`` (ISO 8601; UTC unless the text
has an offset), ``latitude``, ``longitude`` (degrees), optional ``elevation`` (metres), one column per variable
in the store's units (``t2m`` in kelvin; empty: no report), and optionally ``<variable>_flag`` per variable (an
integer; 0 or empty: good, any other value drops that value). CSV (``.csv``, ``.csv.gz``) or Parquet
(``.parquet``, which needs the pyarrow package).

Every bad row gets one ``Problem`` naming its file line (the header is line 1), the column and what is allowed.
Refused (``fatal``): text in a number column, a time that is not ISO 8601, a latitude or longitude out of range,
an empty or unknown ``station_id`` (with ``station_ids``), a duplicate report of a station and time with other
values (identical ones are merged silently; ``duplicates="mean"`` averages conflicting ones instead, with a
line), a station with two locations. Dropped with a line: a flagged value. Checks are vectorised; only the
lines of bad rows are formatted one by one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gridtnp.data.csv_table import read_csv_table
from gridtnp.data.layout import DataError, wrap_longitude

REQUIRED = ("station_id", "time", "latitude", "longitude")
RESERVED = (*REQUIRED, "elevation")
FLAG_SUFFIX = "_flag"
#: Two reports of one station closer than this (degrees) are at the same location.
LOCATION_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Problem:
    """One bad row (or station) of an observation file: where, which column, what is wrong and allowed."""

    source: str
    line: int | None
    column: str
    message: str
    fatal: bool

    def __str__(self) -> str:
        where = f"line {self.line}, " if self.line is not None else ""
        return f"{self.source}: {where}column {self.column}: {self.message}"


def read_table(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """Every column as text (``NaN`` where empty) and each row's file line ``[N]`` (blank lines dropped)."""
    name = str(path)
    if name.endswith(".parquet"):
        try:
            table = pd.read_parquet(name)
        except ImportError as err:
            raise DataError(
                f"{name}: reading Parquet needs the pyarrow package (pip install pyarrow); or write the table as "
                "CSV (.csv or .csv.gz)."
            ) from err
        table = table.astype(str).where(table.notna())
        line = np.arange(len(table)) + 2  # as if written to CSV with a header line
    else:
        try:  # blank lines kept so that row i is line i + 2 of the file (line 1 is the header)
            table = read_csv_table(name, "observations", dtype=str, skip_blank_lines=False)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            raise DataError(f"{name}: cannot be read as a CSV of observations ({type(err).__name__}: {err}).") from err
        line = np.arange(len(table)) + 2
    table.columns = [str(c).strip().lower() for c in table.columns]
    blank = table.isna().all(axis=1).to_numpy()
    return table[~blank].reset_index(drop=True), line[~blank]


def numbers(text: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(values [N] float64, bad [N] bool)``: NaN where empty; ``bad`` where text is not a finite number."""
    stripped = text.str.strip()
    values = pd.to_numeric(stripped, errors="coerce").to_numpy(np.float64)
    given = stripped.notna().to_numpy() & (stripped != "").to_numpy()
    return np.where(given, values, np.nan), given & ~np.isfinite(values)


def read_observations(
    path: str | os.PathLike[str],
    variables: Iterable[str] | None = None,
    station_ids: Iterable[str] | None = None,
    duplicates: str = "refuse",
) -> tuple[pd.DataFrame, list[Problem]]:
    """Reports ``[N rows]`` (``line``, ``station_id``, ``time`` as naive UTC ``datetime64``, ``latitude``,
    ``longitude`` in [-180, 180), ``elevation`` when given, one float column per variable, NaN: no or flagged value)
    and the problems found, one per bad row; rows with a fatal problem are left out of the table.

    ``variables``: the value columns to read (default: every column that is not reserved or a flag);
    ``station_ids``: the known stations (others are refused); ``duplicates``: ``"refuse"`` conflicting reports of
    a station and time, or ``"mean"`` average them.
    """
    if duplicates not in ("refuse", "mean"):
        raise DataError(f"observations.duplicates must be 'refuse' or 'mean'; got {duplicates!r}.")
    source = Path(path).name
    text, line = read_table(path)
    missing = [c for c in REQUIRED if c not in text.columns]
    found = ", ".join(text.columns) or "none"
    if missing:
        raise DataError(
            f"{source}: no column {', '.join(missing)}; an observation file has {', '.join(REQUIRED)}, "
            f"one column per variable and optional elevation and <variable>_flag; found {found}."
        )
    if variables is None:
        variables = [c for c in text.columns if c not in RESERVED and not c.endswith(FLAG_SUFFIX)]
    variables = list(variables)
    absent = [v for v in variables if v not in text.columns]
    if absent or not variables:
        raise DataError(f"{source}: no value column {', '.join(absent) or '(none)'}; found {found}.")

    n = len(text)
    out = pd.DataFrame({"line": line, "station_id": text["station_id"].str.strip().fillna("")})
    # (bad [N], column, message of row i): checked in this order; a row's first problem is its line.
    checks: list[tuple[np.ndarray, str, object, bool]] = []
    empty_id = (out["station_id"] == "").to_numpy()
    checks.append((empty_id, "station_id", lambda i: "empty; every report needs its station's identifier", True))
    if station_ids is not None:
        known = pd.Index([str(s).strip() for s in station_ids])
        unknown = ~out["station_id"].isin(known).to_numpy() & ~empty_id
        checks.append(
            (
                unknown,
                "station_id",
                lambda i: (
                    f"unknown station {out['station_id'].iloc[i]!r}; the "
                    f"station list has {len(known):,} stations (add it there or drop its rows)"
                ),
                True,
            )
        )
    time = pd.to_datetime(text["time"].str.strip(), utc=True, errors="coerce", format="ISO8601")
    out["time"] = time.dt.tz_convert(None).to_numpy()
    checks.append(
        (
            time.isna().to_numpy(),
            "time",
            lambda i: (
                f"{text['time'].iloc[i]!r} is not a time; "
                "allowed: ISO 8601 such as 2019-03-27T12:00:00Z (UTC unless an offset is given)"
            ),
            True,
        )
    )
    for column, low, high in (("latitude", -90.0, 90.0), ("longitude", -180.0, 360.0)):
        values, bad = numbers(text[column])
        bad |= np.isnan(values) | (values < low) | (values > high)
        out[column] = wrap_longitude(values) if column == "longitude" else values
        checks.append(
            (
                bad,
                column,
                lambda i, c=column, lo=low, hi=high: (
                    f"{text[c].iloc[i]!r} is not allowed; {c} takes a number of degrees in [{lo:g}, {hi:g}]"
                ),
                True,
            )
        )
    if "elevation" in text.columns:
        out["elevation"], bad = numbers(text["elevation"])
        checks.append(
            (
                bad,
                "elevation",
                lambda i: (
                    f"{text['elevation'].iloc[i]!r} is not a number; elevation takes metres above sea level (or empty)"
                ),
                True,
            )
        )
    for v in variables:
        out[v], bad = numbers(text[v])
        checks.append(
            (
                bad,
                v,
                lambda i, v=v: (
                    f"{text[v].iloc[i]!r} is not a number; {v} takes a number in the "
                    "store's units (or empty: no report)"
                ),
                True,
            )
        )
        flag_column = f"{v}{FLAG_SUFFIX}"
        if flag_column in text.columns:
            flag, bad = numbers(text[flag_column])
            bad |= np.isfinite(flag) & (flag != np.round(flag))
            checks.append(
                (
                    bad,
                    flag_column,
                    lambda i, c=flag_column: (
                        f"{text[c].iloc[i]!r} is not an integer "
                        "flag; allowed: 0 or empty (good) or another integer (the value is dropped)"
                    ),
                    True,
                )
            )
            flagged = np.isfinite(flag) & (flag != 0) & ~bad & np.isfinite(out[v].to_numpy())
            checks.append(
                (
                    flagged,
                    flag_column,
                    lambda i, c=flag_column, v=v: (
                        f"flagged value dropped ({c}="
                        f"{text[c].iloc[i].strip()}; 0 or empty is good, any other flag drops {v})"
                    ),
                    False,
                )
            )
            out.loc[flagged, v] = np.nan

    problems, fatal = _first_per_row(checks, line, source, n)
    out = out[~fatal].reset_index(drop=True)
    out, more = _duplicates(out, variables, source, duplicates)
    problems += more
    moved, lines = _two_locations(out, source)
    problems += lines
    out = out[~out["station_id"].isin(moved) & ~out["line"].isin([p.line for p in more if p.fatal])]
    return out.reset_index(drop=True), sorted(problems, key=lambda p: p.line or 0)


def _first_per_row(
    checks: list[tuple[np.ndarray, str, object, bool]], line: np.ndarray, source: str, n: int
) -> tuple[list[Problem], np.ndarray]:
    """One Problem per bad row (its first failed check), in file order, and ``fatal [N]``."""
    first = np.full(n, -1)
    for k, (bad, *_rest) in enumerate(checks):
        first = np.where((first < 0) & bad, k, first)
    rows = np.flatnonzero(first >= 0)
    problems = []
    for i in rows:  # the few bad rows only
        _bad, column, message, is_fatal = checks[first[i]]
        problems.append(Problem(source, int(line[i]), column, message(i), is_fatal))  # type: ignore[operator]
    fatal = np.zeros(n, dtype=bool)
    fatal[rows] = [checks[first[i]][3] for i in rows]
    return problems, fatal


def _duplicates(
    table: pd.DataFrame, variables: list[str], source: str, rule: str
) -> tuple[pd.DataFrame, list[Problem]]:
    """``table`` with repeated reports of one station and time merged: identical ones silently; other ones
    refused (a fatal line for each repeat, naming the first) or, with ``rule="mean"``, averaged (a line each)."""
    keys = ["station_id", "time"]
    group = table.groupby(keys, sort=False).ngroup().to_numpy()
    _, first_row = np.unique(group, return_index=True)
    first = first_row[group]  # [N] the first row of each row's group
    repeat = np.arange(len(table)) != first
    if not repeat.any():
        return table, []
    columns = [*variables, "latitude", "longitude"]
    a, b = table[columns].to_numpy(np.float64), table[columns].to_numpy(np.float64)[first]
    same = ((a == b) | (np.isnan(a) & np.isnan(b))).all(1)
    conflict = repeat & ~same
    problems = []
    for i in np.flatnonzero(conflict):
        j = first[i]
        differs = next(c for k, c in enumerate(columns) if not (a[i, k] == b[i, k] or np.isnan(a[i, k] + b[i, k])))
        what = f"{differs} {table[differs].iloc[j]:g} there, {table[differs].iloc[i]:g} here"
        station, when = table["station_id"].iloc[i], pd.Timestamp(table["time"].iloc[i]).isoformat()
        if rule == "mean":
            message = f"duplicate report of {station!r} at {when} (also line {table['line'].iloc[j]}: {what}); averaged"
        else:
            message = (
                f"duplicate report of {station!r} at {when} with other values (also line "
                f"{table['line'].iloc[j]}: {what}); one report per station and time is allowed (drop one, "
                "or set observations.duplicates: mean)"
            )
        problems.append(Problem(source, int(table["line"].iloc[i]), differs, message, rule != "mean"))
    if rule == "mean":
        means = table.groupby(group)[variables].transform("mean")
        table = table.assign(**{v: means[v].to_numpy() for v in variables})
    keep = ~repeat | (conflict & (rule != "mean"))  # refused repeats stay until the caller drops their lines
    return table[keep].reset_index(drop=True), problems


def _two_locations(table: pd.DataFrame, source: str) -> tuple[list[str], list[Problem]]:
    """The stations whose reports give two locations, and a fatal line for each (naming one line of each)."""
    spread = table.groupby("station_id", sort=False)[["latitude", "longitude"]].agg(lambda c: c.max() - c.min())
    moved = spread.index[(spread > LOCATION_TOLERANCE).any(axis=1).to_numpy()]
    problems = []
    for station in moved:  # the few refused stations only
        rows = table[table["station_id"] == station]
        one = rows.iloc[0]
        other = rows[
            (rows["latitude"] - one["latitude"]).abs().gt(LOCATION_TOLERANCE)
            | (rows["longitude"] - one["longitude"]).abs().gt(LOCATION_TOLERANCE)
        ].iloc[0]
        problems.append(
            Problem(
                source,
                int(other["line"]),
                "latitude, longitude",
                f"station '{station}' has two locations: ({one['latitude']:g}, {one['longitude']:g}) on line "
                f"{one['line']} and ({other['latitude']:g}, {other['longitude']:g}) here; one location per station_id "
                "is allowed (give a moved station a new identifier)",
                True,
            )
        )
    return list(moved), problems
