"""Where stations are relative to each other and to the coast, for the report's breakdowns. Points are (lat, lon)
in degrees; distances are great-circle kilometres on a sphere of radius 6,371 km.

* ``pairwise_km(a, b)``: distances ``[Na, Nb]`` between two point sets.
* ``nearest_context_km(points, is_context)``: for each hour and station, the distance to the nearest *other*
  station in that hour's context ``[T, S]``.
* ``coast_distance_km(points)``: each station's distance to the GSHHS coastline (its nearest vertex) ``[S]``.
"""

from __future__ import annotations

import numpy as np

EARTH_RADIUS_KM = 6371.0
#: A station within this distance of the coastline is "coastal" in the report's breakdown.
COASTAL_KM = 10.0


def pairwise_km(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Great-circle distances ``[Na, Nb]`` between ``a [Na, 2]`` and ``b [Nb, 2]`` (lat, lon in degrees)."""
    lat_a, lon_a = np.radians(a[:, 0])[:, None], np.radians(a[:, 1])[:, None]
    lat_b, lon_b = np.radians(b[:, 0])[None], np.radians(b[:, 1])[None]
    h = np.sin((lat_b - lat_a) / 2) ** 2 + np.cos(lat_a) * np.cos(lat_b) * np.sin((lon_b - lon_a) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def nearest_context_km(points: np.ndarray, is_context: np.ndarray, chunk_elements: int = 20_000_000) -> np.ndarray:
    """For stations ``points [S, 2]`` and the context flags ``is_context [T, S]`` of each hour: the distance from
    each station to the nearest other context station of that hour ``[T, S]`` (inf where there is none)."""
    d = pairwise_km(points, points)
    np.fill_diagonal(d, np.inf)  # a context station's own value is no neighbour
    t, s = is_context.shape
    out = np.empty((t, s))
    step = max(1, chunk_elements // max(s * s, 1))  # hours at a time: [step, S, S] stays within memory
    for start in range(0, t, step):
        flags = is_context[start : start + step].astype(bool)  # [h, S]
        out[start : start + step] = np.where(flags[:, None, :], d[None], np.inf).min(-1)
    return out


def coast_distance_km(points: np.ndarray, pad: float = 2.0) -> np.ndarray:
    """Each station's distance ``[S]`` to the nearest vertex of the GSHHS coastline (intermediate resolution for a
    box up to 25 degrees, ``gridtnp.report.coastlines``); NaN without the coastline data or without a coast within
    ``pad`` degrees of the stations' box."""
    from gridtnp.report.coastlines import available, coastline_segments

    if not len(points) or not available():
        return np.full(len(points), np.nan)
    lat, lon = points[:, 0], points[:, 1]
    lines = coastline_segments((float(lon.min()), float(lon.max())), (float(lat.min()), float(lat.max())), pad=pad)
    if not lines:
        return np.full(len(points), np.nan)
    vertices = np.concatenate(lines)[:, ::-1].astype(np.float64)  # (lon, lat) -> (lat, lon)
    out = np.full(len(points), np.inf)
    step = max(1, 20_000_000 // len(vertices))
    for start in range(0, len(points), step):  # [step, V] at a time
        out[start : start + step] = pairwise_km(points[start : start + step], vertices).min(1)
    return out
