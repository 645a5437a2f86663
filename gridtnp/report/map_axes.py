"""The geometry of longitude / latitude maps: their extent, aspect and longitude convention, the figure's layout,
and axes with coastlines (``gridtnp.report.coastlines``). Points are ``[N, 2]`` (lat, lon) arrays in degrees.

* ``compact_longitudes(points)``: a box across the date line in one run of longitudes (140 to 200), not split.
* ``map_aspect(points)``, ``map_figure(points, panels, ...)``: width over height; a figure of ``panels`` maps,
  two wide ones a row for a global map.
* ``geographic_axes(ax, points)``: degree-labelled axes (``10°W``, ``52°N``), aspect and coastlines over the points'
  extent.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gridtnp.data.layout import wrap_longitude


def _stacked(points: list[np.ndarray]) -> np.ndarray:
    """The point sets ``[N_i, 2]`` (lat, lon) as one ``[N, 2]`` array (``[0, 2]`` without points)."""
    return np.concatenate([p[:, :2] for p in points if len(p)]) if any(len(p) for p in points) else np.zeros((0, 2))


def _extent(points: list[np.ndarray]) -> tuple[float, float, float, float, float] | None:
    """``(lat_lo, lat_hi, lon_lo, lon_hi, middle)`` of the point sets, ``middle`` the latitude (within 80 degrees of
    the equator) whose degree of longitude the map keeps; None without points."""
    xy = _stacked(points)
    if not len(xy):
        return None
    (lat_lo, lon_lo), (lat_hi, lon_hi) = xy.min(0), xy.max(0)
    return float(lat_lo), float(lat_hi), float(lon_lo), float(lon_hi), float(np.clip((lat_lo + lat_hi) / 2, -80, 80))


def compact_longitudes(points: list[np.ndarray]) -> list[np.ndarray]:
    """Point sets ``[N, 2]`` (lat, lon) with longitudes shifted by 360 degrees where that at least halves the
    map's width: cut at the widest band of longitude with no point, so that stations of a box across the date line
    (140 E to 160 W, read from a file as 140..180 and -180..-160) make one map from 140 to 200. Global and other
    maps keep their longitudes."""
    lon = _stacked(points)[:, 1]
    lon = lon[np.isfinite(lon)]
    if lon.size < 2:
        return points
    ring = np.unique(np.mod(lon, 360.0))
    gaps = np.diff(np.r_[ring, ring[0] + 360.0])
    if 360.0 - float(gaps.max()) > (lon.max() - lon.min()) / 2:
        return points
    west = float(wrap_longitude(ring[(int(gaps.argmax()) + 1) % len(ring)]))  # the map's western edge
    return [np.c_[p[:, :1], west + np.mod(p[:, 1:2] - west, 360.0), p[:, 2:]] if len(p) else p for p in points]


def map_figure(
    points: list[np.ndarray], panels: int, columns: int, height: float, geographic: bool = True
) -> tuple[Figure, int, int]:
    """A figure for ``panels`` maps of ``points`` and its rows and columns: ``columns`` panels 4.8 by ``height``
    inches a row, or two of 7.2 by 4.2 where the map is much wider than tall (global, ``map_aspect`` above 1.5)."""
    wide = geographic and map_aspect(points) > 1.5
    ncols, (width, tall) = (min(2, panels), (7.2, 4.2)) if wide else (min(columns, panels), (4.8, height))
    nrows = math.ceil(panels / ncols)
    return Figure(figsize=(width * ncols, tall * nrows), layout="constrained"), nrows, ncols


def map_aspect(points: list[np.ndarray]) -> float:
    """Width over height of a geographic map of ``points`` (lists of ``[N, 2]`` (lat, lon)), a degree of longitude
    at its length at the middle latitude (as ``geographic_axes`` draws it); 1 without points."""
    extent = _extent(points)
    if extent is None:
        return 1.0
    lat_lo, lat_hi, lon_lo, lon_hi, middle = extent
    return max(lon_hi - lon_lo, 0.5) * math.cos(math.radians(middle)) / max(lat_hi - lat_lo, 0.5)


def degrees_east(lon: float) -> str:
    """A longitude tick: ``10°W``, ``0°``, ``2°E`` (a longitude beyond 180, as on a map across the date line, named
    by its wrapped value: ``190`` is ``170°W``)."""
    lon = float(wrap_longitude(lon))
    text = f"{abs(lon):g}°"
    return text if abs(lon) < 1e-9 or abs(abs(lon) - 180.0) < 1e-9 else text + ("E" if lon > 0 else "W")


def degrees_north(lat: float) -> str:
    """A latitude tick: ``52°N``, ``0°``, ``33°S``."""
    text = f"{abs(lat):g}°"
    return text if abs(lat) < 1e-9 else text + ("N" if lat > 0 else "S")


def geographic_axes(ax: Any, points: list[np.ndarray]) -> None:
    """Longitude / latitude labels, an aspect that keeps a degree of longitude its length at the map's middle
    latitude, and coastlines and borders (``gridtnp.report.coastlines``) over the extent of ``points`` (lists of
    ``[N, 2]`` (lat, lon))."""
    from matplotlib.ticker import FuncFormatter

    from gridtnp.report.coastlines import draw_coastlines

    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: degrees_east(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: degrees_north(v)))
    extent = _extent(points)
    if extent is None:
        return
    lat_lo, lat_hi, lon_lo, lon_hi, middle = extent
    pad_lat, pad_lon = 0.03 * max(lat_hi - lat_lo, 0.5), 0.03 * max(lon_hi - lon_lo, 0.5)
    ax.set_xlim(lon_lo - pad_lon, lon_hi + pad_lon)
    ax.set_ylim(lat_lo - pad_lat, lat_hi + pad_lat)
    ax.set_aspect(1.0 / math.cos(math.radians(middle)), adjustable="box")
    draw_coastlines(ax, (lon_lo, lon_hi), (lat_lo, lat_hi))
