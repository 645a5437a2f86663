"""The cells of a gridded context given to the predict API: each coarse value's extent, and grids on 2-D coordinates.

* ``cell_edges(centres, bounds)``: ``lower, upper [n]`` of each cell along one axis: its CF bounds when given, else
  from the spacing of the centres around it (the edge between two cells halfway between their centres; a first or
  last cell narrower or wider than its neighbour, such as a partial block at the edge of a coarsened field, keeps
  the edge its neighbour's other side implies).
* ``cell_weights(centres, axis, name, bounds)``: ``[n, len(axis)]`` weights averaging the points of ``axis`` inside
  each cell, as a coarse block averages its fine points.
* ``gridded_context(context, coords)``: every source as a DataArray (a Dataset's CF bounds variables read out, as
  ``{source: {coordinate: [n, 2]}}``) and a grid on 2-D coordinates that form a rectilinear grid given 1-D ones.
* ``is_gridded(array, coords)``: whether ``coords`` are dimensions of ``array`` (a grid, not a point table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from gridtnp.data.layout import wrap_longitude
from gridtnp.registry import ConfigError

LONGITUDES = ("longitude", "lon")
Bounds = dict[str, dict[str, np.ndarray]]


def cell_edges(centres: np.ndarray, bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``lower, upper [n]`` of the cells around ``centres [n]`` (monotonic, either direction); ``bounds [n, 2]`` (CF
    bounds) when given. A lone centre has no extent (``lower == upper``)."""
    centres = np.asarray(centres, dtype=np.float64)
    if bounds is not None:
        bounds = np.asarray(bounds, dtype=np.float64)
        return bounds.min(-1), bounds.max(-1)
    n = len(centres)
    if n < 2:
        return centres.copy(), centres.copy()
    edges = np.empty(n + 1)
    edges[1:-1] = (centres[1:] + centres[:-1]) / 2
    if n >= 4:  # an end cell of another width: the edge its neighbour, symmetric about its centre, implies
        for end, inner, far in ((1, 1, 2), (n - 1, n - 2, n - 2)):
            implied = 2 * centres[inner] - edges[far]
            if min(centres[end - 1], centres[end]) < implied < max(centres[end - 1], centres[end]):
                edges[end] = implied
    edges[0], edges[-1] = 2 * centres[0] - edges[1], 2 * centres[-1] - edges[-2]
    return np.minimum(edges[:-1], edges[1:]), np.maximum(edges[:-1], edges[1:])


def cell_weights(centres: np.ndarray, axis: np.ndarray, name: str, bounds: np.ndarray | None = None) -> np.ndarray:
    """``[n, len(axis)]`` weights averaging the points of ``axis`` within each cell (``cell_edges``); a cell holding
    none of them (a lone centre, a cell finer than ``axis``) takes its nearest point. Longitudes are read in
    ``axis``' convention (past 180 degrees too) and across the date line."""
    centres, axis = np.asarray(centres, dtype=np.float64), np.asarray(axis, dtype=np.float64)
    shifts = np.zeros(1)
    if name in LONGITUDES:
        middle = (axis.min() + axis.max()) / 2
        centres = wrap_longitude(centres, middle)  # the grid's convention
        if bounds is None and len(centres) > 1:
            centres = np.unwrap(centres, period=360.0)  # a run across the seam stays monotonic
        shifts = np.array([-360.0, 0.0, 360.0])
    lower, upper = cell_edges(centres, bounds)
    if name in LONGITUDES:
        moved = wrap_longitude(lower, (axis.min() + axis.max()) / 2) - lower
        lower, upper = lower + moved, upper + moved
    points = axis[None, None, :] + shifts[:, None, None]  # [shifts, 1, len(axis)]
    inside = ((points >= lower[None, :, None]) & (points < upper[None, :, None])).any(0)  # [n, len(axis)]
    nearest = np.abs(points - centres[None, :, None]).min(0).argmin(1)  # [n]
    inside[np.arange(len(centres)), nearest] |= ~inside.any(1)
    return inside / inside.sum(1, keepdims=True)


def is_gridded(array: xr.DataArray, coords: Sequence[str]) -> bool:
    """Whether every one of ``coords`` is a dimension of ``array``: a grid, each value one cell."""
    return all(c in array.dims for c in coords)


def gridded_context(
    context: Mapping[str, xr.DataArray | xr.Dataset], coords: Sequence[str]
) -> tuple[dict[str, xr.DataArray], Bounds]:
    """Each source as a DataArray, and the CF bounds ``{source: {coordinate: [n, 2]}}`` of the sources given as a
    Dataset (one data variable beside the variables its coordinates' ``bounds`` attributes name). A source whose
    latitude and longitude are 2-D coordinates of a rectilinear grid (each varying along one dimension) gets them as
    1-D coordinates, so it is read as a grid."""
    arrays, bounds = {}, {}
    for name, value in context.items():
        if isinstance(value, xr.Dataset):
            value, found = _split_bounds(name, value, coords)
            if found:
                bounds[name] = found
        if not isinstance(value, xr.DataArray):
            raise ConfigError(f"predict: context {name!r} is a {type(value).__name__}; expected an xarray DataArray.")
        arrays[name] = _one_dimensional(name, value, coords)
    return arrays, bounds


def _split_bounds(name: str, ds: xr.Dataset, coords: Sequence[str]) -> tuple[xr.DataArray, dict[str, np.ndarray]]:
    """The one data variable of ``ds`` and the bounds ``[n, 2]`` its coordinates' ``bounds`` attributes name."""
    named = {c: str(ds[c].attrs["bounds"]) for c in coords if c in ds.coords and "bounds" in ds[c].attrs}
    found = {}
    for c, variable in named.items():
        if variable not in ds.variables:
            raise ConfigError(
                f"predict: context {name!r}: coordinate {c!r} names the bounds variable {variable!r}, which the "
                f"Dataset lacks (it has {', '.join(map(str, ds.variables))})."
            )
        values = ds[variable]
        if values.ndim != 2 or values.shape != (ds[c].size, 2):
            raise ConfigError(
                f"predict: context {name!r}: bounds {variable!r} of {c!r} has shape {values.shape}; expected "
                f"({ds[c].size}, 2), the lower and upper edge of each cell."
            )
        found[c] = values.values
    data = [v for v in ds.data_vars if v not in named.values()]
    if len(data) != 1:
        raise ConfigError(
            f"predict: context {name!r} is a Dataset with data variables {[str(v) for v in data]}; expected one "
            "(besides its coordinates' bounds): pass ds[[variable, *bounds]] or a DataArray."
        )
    return ds[data[0]], found


def _one_dimensional(name: str, array: xr.DataArray, coords: Sequence[str]) -> xr.DataArray:
    """``array`` with 2-D latitude/longitude coordinates of a rectilinear grid as 1-D coordinates (dims renamed to
    them); unchanged otherwise (a grid on 1-D coordinates, a point table, or a curvilinear grid)."""
    two_d = [c for c in coords if c in array.coords and array[c].ndim == 2 and c not in array.dims]
    if len(two_d) != 2 or array[two_d[0]].dims != array[two_d[1]].dims:
        return array
    along = {}
    for c in two_d:
        values = array[c].values
        for axis, dim in enumerate(array[c].dims):
            if np.allclose(values, values.take([0], axis=1 - axis)):  # constant across the other dimension
                along[c] = (dim, values.take(0, axis=1 - axis))
    if len(along) != 2 or along[two_d[0]][0] == along[two_d[1]][0]:
        return array
    out = array.drop_vars(two_d).assign_coords({c: along[c] for c in two_d})
    return out.swap_dims({along[c][0]: c for c in two_d})


def refuse_curvilinear(name: str, array: xr.DataArray, coords: Sequence[str]) -> None:
    """A ``ConfigError`` for a source on 2-D coordinates that are not a rectilinear grid, where its cells matter."""
    two_d = [c for c in coords if c in array.coords and array[c].ndim == 2]
    if two_d:
        raise ConfigError(
            f"predict: context {name!r} has 2-D {' and '.join(two_d)} coordinates of a curvilinear grid, whose cells "
            "predict cannot take the climatology over: regrid it to 1-D latitude and longitude coordinates (a "
            "rectilinear grid), or pass its values as a point table (one dimension, each value taking the "
            "climatology of its nearest grid point)."
        )
