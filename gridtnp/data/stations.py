"""Station locations from CSV, checked row by row, and snapped to a regular latitude/longitude grid by index arithmetic.

>>> stations = read_stations(sample_path(STATIONS_SAMPLE), grid_lat=ds.latitude.values, grid_lon=ds.longitude.values)
>>> stations[stations.inside & ~stations.duplicate]      # one station per grid point of the store's box
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import pandas as pd

from gridtnp.data.csv_table import read_csv_table
from gridtnp.data.layout import DataError, wrap_longitude

COLUMN_ALIASES: dict[str, tuple[str, ...]] = {
    "latitude": ("latitude", "lat"),
    "longitude": ("longitude", "lon", "long"),
    "station_id": ("station_id",),
}
_MAX_ROWS_LISTED = 10


class Snapped(NamedTuple):
    """Nearest grid point of each station ``[N]``; indices are clipped into the grid, ``inside`` says which count."""

    lat_index: np.ndarray
    lon_index: np.ndarray
    inside: np.ndarray


def read_stations(
    path: str | os.PathLike[str], grid_lat: np.ndarray | None = None, grid_lon: np.ndarray | None = None
) -> pd.DataFrame:
    """Stations ``[N rows]``: float ``latitude``, ``longitude`` in [-180, 180), ``station_id`` and value columns as
    read; given a grid, also ``lat_index``, ``lon_index``, ``inside`` (``snap_to_grid``) and ``duplicate``."""
    name = str(path)
    try:
        header = pd.read_csv(name, nrows=0)
        columns = {str(c).strip().lower(): c for c in header.columns}
        found = {
            key: next((columns[a] for a in aliases if a in columns), None) for key, aliases in COLUMN_ALIASES.items()
        }
        if found["latitude"] is None or found["longitude"] is None:
            raise DataError(
                f"{name}: expected columns latitude and longitude (or lat, lon; any case); found "
                f"{', '.join(map(str, header.columns)) or 'none'}."
            )
        as_text = {found[k]: str for k in COLUMN_ALIASES if found[k] is not None}
        # Blank lines kept so that row i of the frame is line i + 2 of the file (line 1 is the header).
        table = read_csv_table(name, "stations", dtype=as_text, skip_blank_lines=False)
    except DataError:
        raise
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise DataError(f"{name}: cannot be read as a CSV of stations ({type(err).__name__}: {err}).") from err
    table = table.rename(columns={found[k]: k for k in COLUMN_ALIASES if found[k] is not None})
    line = np.arange(len(table)) + 2
    blank = table.isna().all(axis=1).to_numpy()
    table, line = table[~blank].reset_index(drop=True), line[~blank]

    lat = pd.to_numeric(table["latitude"].str.strip(), errors="coerce").to_numpy(np.float64)
    lon = pd.to_numeric(table["longitude"].str.strip(), errors="coerce").to_numpy(np.float64)
    bad = ~(np.isfinite(lat) & np.isfinite(lon) & (np.abs(lat) <= 90) & (lon >= -180) & (lon < 360))
    if bad.any():
        rows = np.flatnonzero(bad)
        listed = ", ".join(
            f"line {line[i]} (latitude={table['latitude'].iloc[i]!r}, longitude={table['longitude'].iloc[i]!r})"
            for i in rows[:_MAX_ROWS_LISTED]
        )
        more = f" and {len(rows) - _MAX_ROWS_LISTED} more" if len(rows) > _MAX_ROWS_LISTED else ""
        raise DataError(
            f"{name}: {len(rows)} malformed row(s): {listed}{more}. Expected numeric latitude in [-90, 90] and "
            "longitude in [-180, 360)."
        )
    table["latitude"] = lat
    table["longitude"] = wrap_longitude(lon)
    if grid_lat is not None or grid_lon is not None:
        if grid_lat is None or grid_lon is None:
            raise DataError("read_stations: pass both grid_lat and grid_lon to snap stations to a grid.")
        snapped = snap_to_grid(table, grid_lat, grid_lon)
        table["lat_index"] = snapped.lat_index
        table["lon_index"] = snapped.lon_index
        table["inside"] = snapped.inside
        table["duplicate"] = flag_duplicates(snapped)
    return table


def snap_to_grid(stations: pd.DataFrame, lat_axis: np.ndarray, lon_axis: np.ndarray) -> Snapped:
    """Nearest grid point of each station ``[N]`` on regular axes ``lat_axis [H]``, ``lon_axis [W]``, in O(N).

    ``inside`` marks stations within the grid's box widened by half a grid step (their grid cell is in the grid);
    longitudes are compared modulo 360, and a longitude axis spanning 360 degrees wraps (every longitude inside).
    """
    n_lat, n_lon = len(lat_axis), len(lon_axis)
    lat_f = _fractional_index(stations["latitude"].to_numpy(np.float64), np.asarray(lat_axis, np.float64), "latitude")
    lon_f = _fractional_index(stations["longitude"].to_numpy(np.float64), np.asarray(lon_axis, np.float64), "longitude")
    inside = (lat_f >= -0.5) & (lat_f <= n_lat - 0.5)
    lon_i = np.rint(lon_f)
    if np.isclose(abs(float(lon_axis[1]) - float(lon_axis[0])) * n_lon, 360.0):
        lon_i = np.mod(lon_i, n_lon)
    else:
        inside &= lon_f <= n_lon - 0.5
    lat_i = np.clip(np.rint(lat_f), 0, n_lat - 1).astype(np.int64)
    return Snapped(lat_i, np.clip(lon_i, 0, n_lon - 1).astype(np.int64), inside)


def flag_duplicates(snapped: Snapped) -> np.ndarray:
    """``[N]`` bool: an inside station whose grid point an earlier inside station already has (keep ``~duplicate``)."""
    n_lon = int(snapped.lon_index.max(initial=0)) + 1
    cell = snapped.lat_index * n_lon + snapped.lon_index
    # Outside stations get distinct negative cells, so they never count as duplicates.
    cell = np.where(snapped.inside, cell, -1 - np.arange(len(cell)))
    return pd.Series(cell).duplicated(keep="first").to_numpy()


def _fractional_index(x: np.ndarray, axis: np.ndarray, name: str) -> np.ndarray:
    """``[N]`` position of ``x`` in grid steps along a regular ``axis``; longitudes east of its first point mod 360."""
    first, step = _regular(axis, name)
    offset = x - first
    if name == "longitude":
        # Measured eastward (westward for a descending axis) from half a cell before the first point, mod 360.
        offset = np.mod(offset * np.sign(step) + abs(step) / 2, 360.0) * np.sign(step) - step / 2
    return offset / step


def _regular(axis: np.ndarray, name: str) -> tuple[float, float]:
    """First value and step of a regular axis; an error names the axis when it is not regular."""
    if axis.ndim != 1 or axis.size < 2:
        raise DataError(f"snap_to_grid: the {name} axis needs at least two points, got shape {axis.shape}.")
    steps = np.diff(axis)
    step = float(steps.mean())
    if step == 0 or not np.allclose(steps, step, rtol=1e-6, atol=1e-9 * abs(step)):
        raise DataError(
            f"snap_to_grid: the {name} axis is not regular (steps from {steps.min():g} to {steps.max():g}); "
            "snapping by index arithmetic needs equally spaced points."
        )
    return float(axis[0]), step


def station_box(table: pd.DataFrame, lat: np.ndarray, lon: np.ndarray) -> dict[str, object]:
    """``GridDataModule.target_box`` of stations snapped to the grid ``lat [H]``, ``lon [W]`` (their ``lat_index``,
    ``lon_index``, the locations the tasks give): the corners ``[latitude, longitude]`` of the stations and the grid."""
    at = (lat[table["lat_index"].to_numpy()], lon[table["lon_index"].to_numpy()])
    return {
        "axes": ["latitude", "longitude"],
        "targets": ([float(a.min()) for a in at], [float(a.max()) for a in at]),
        "grid": ([float(lat.min()), float(lon.min())], [float(lat.max()), float(lon.max())]),
    }
