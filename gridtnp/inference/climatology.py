"""The hourly climatology a checkpoint keeps, taken off a user's context and added back at the targets.

* ``departures_from_reference(module, context, targets, coords, batch_dim, bounds)``: each context array minus the
  climatology at its time (a gridded source: the mean over each cell's points; points: the nearest grid point), and
  the climatology at the targets ``[B, N, Dy]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp.data.stations import snap_to_grid
from gridtnp.inference.cells import Bounds, cell_weights, is_gridded, refuse_curvilinear
from gridtnp.inference.inputs import points, template, utc_times
from gridtnp.registry import ConfigError


def departures_from_reference(
    module: Any,
    context: Mapping[str, xr.DataArray],
    targets: xr.DataArray | xr.Dataset,
    coords: Sequence[str],
    batch_dim: str | None,
    bounds: Bounds | None = None,
) -> tuple[dict[str, xr.DataArray], np.ndarray]:
    """For a checkpoint trained on departures from an hourly climatology (``StationReanalysisDataModule``'s
    ``climatology``): each context array minus the climatology at its time and points, and the target variables'
    climatology at the targets ``[B, N, Dy]``.

    A gridded source (``coords`` both dimensions of the array) takes the mean of the climatology over each cell
    (``cells.cell_weights``: its CF ``bounds`` when given, else the spacing around it), as a coarse block
    averages its fine points; a point table takes each point's nearest grid point. The hour of day comes from a
    ``time`` coordinate (along ``batch_dim``, or a scalar).
    """
    meta = module.data_metadata
    climatology, sources = meta["climatology"], meta.get("sources", {})
    if not isinstance(climatology, dict) or "variables" not in climatology:
        raise ConfigError(
            "predict: this checkpoint was trained on departures from an hourly climatology but does not keep it (it "
            "predates gridtnp saving it): predict with `gridtnp predict` and the DataModule, or subtract the "
            "climatology yourself and pass stats={source: (0.0, std)} and target_stats=(0.0, std)."
        )
    grid = (np.asarray(climatology["latitude"]), np.asarray(climatology["longitude"]))
    fields = {name: np.asarray(field, dtype=np.float64) for name, field in climatology["variables"].items()}
    first = next(iter(context.values()))
    time = first.coords.get("time")
    if time is None or (time.ndim and (batch_dim is None or time.dims != (batch_dim,))):
        raise ConfigError(
            "predict: this checkpoint was trained on departures from the hourly climatology of its training dates, "
            "so the context needs its time: a scalar `time` coordinate, or one along batch_dim "
            f"({batch_dim!r}), on {next(iter(context))!r}."
        )
    hours = utc_times(time.values, f"the time of context {next(iter(context))!r}").hour.to_numpy()  # [B] or [1]
    lead = [] if batch_dim is None else [batch_dim]
    out = {}
    for name, array in context.items():
        names = sources.get(name, [])
        if len(names) != 1 or names[0] not in fields:
            raise ConfigError(f"predict: the checkpoint's climatology has no field for context {name!r} ({names}).")
        field = fields[names[0]][hours]  # [B, H, W]
        if is_gridded(array, coords):  # the mean over each cell
            given = (bounds or {}).get(name, {})
            lat_map, lon_map = (
                cell_weights(array[c].values, axis, c, given.get(c)) for c, axis in zip(coords, grid, strict=True)
            )
            reference = xr.DataArray(np.einsum("ih,bhw,jw->bij", lat_map, field, lon_map), dims=["_b", *coords])
        else:  # points: the nearest grid point's value
            refuse_curvilinear(name, array, coords)
            point_dims = [d for d in array.dims if d not in lead]
            lat, lon = (np.broadcast_to(array[c].values, [array.sizes[d] for d in point_dims]).ravel() for c in coords)
            rows, cols = nearest_points(lat, lon, grid)
            values = field[:, rows, cols].reshape(len(hours), *[array.sizes[d] for d in point_dims])
            reference = xr.DataArray(values, dims=["_b", *point_dims])
        reference = reference.rename({"_b": batch_dim}) if lead else reference.isel(_b=0)
        out[name] = (array - reference).transpose(*array.dims).assign_attrs(array.attrs)
    at = points(template(targets, coords), coords, "targets")  # [N, Dx]
    rows, cols = nearest_points(at[:, 0], at[:, 1], grid)
    target_names = meta.get("target", [])
    missing = [v for v in target_names if v not in fields]
    if missing:
        raise ConfigError(f"predict: the checkpoint's climatology lacks the target variable(s) {missing}.")
    reference_t = np.stack([fields[v][hours][:, rows, cols] for v in target_names], -1)  # [B or 1, N, Dy]
    b = first.sizes[batch_dim] if batch_dim is not None else 1
    return out, np.broadcast_to(reference_t, (b, *reference_t.shape[1:]))


def nearest_points(
    lat: np.ndarray, lon: np.ndarray, grid: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Row and column ``[N]`` of the nearest point of the regular ``grid`` (lat, lon) to each point (longitudes mod
    360)."""
    snapped = snap_to_grid(pd.DataFrame({"latitude": lat, "longitude": lon}), *grid)
    return snapped.lat_index, snapped.lon_index
