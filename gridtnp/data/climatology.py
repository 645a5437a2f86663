"""The hourly climatology of a prepared store: computed once by ``gridtnp data prepare --climatology``, read by the
DataModules at ``setup`` instead of a pass over the training period.

The store's ``climatology`` group holds, per variable, the mean at each grid point (and level) and UTC hour of day
over the training period, ``[hour, (level,) latitude, longitude]`` float32 (accumulated in float64);
``attrs[CLIMATOLOGY_ATTR]`` records the period (``train_start``, ``train_end``, ``steps``) so that a DataModule
uses it only when its training dates are those hours.

* ``lazy_climatology(train)``: the lazy hourly means of a (dask-backed) training-period dataset.
* ``write_climatology(store, computed, train)``: write them into a store being prepared.
* ``read_climatology(path, variables, hours, ...)``: ``{variable: [24, H * W]}`` from the store, or None when it has
  none for those variables and training hours.
* ``computed_climatology(ds, variables, hours, where)``: the same computed from the store, a pass over those hours.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.layout import DataError, iso
from gridtnp.data.store import columns_as_read, time_chunk

CLIMATOLOGY_GROUP = "climatology"
CLIMATOLOGY_ATTR = "gridtnp_climatology"


def lazy_climatology(train: xr.Dataset) -> xr.Dataset:
    """Lazy mean of every variable of ``train`` at each UTC hour of day: ``[hour, (level,) lat, lon]`` float64."""
    hour = xr.DataArray(train.indexes["time"].hour.to_numpy(), dims="time", name="hour")
    out = train.astype(np.float64).groupby(hour).mean("time")
    return out.drop_vars([c for c in out.coords if c not in out.dims])


def write_climatology(store: Path, computed: xr.Dataset, train: xr.Dataset) -> dict[str, Any]:
    """Write the computed climatology into ``store``'s ``climatology`` group (float32); return the record for
    ``attrs[CLIMATOLOGY_ATTR]``."""
    ds = computed.astype(np.float32, copy=False)  # the writer's means are float32 already: no second copy
    for var in ds.variables.values():
        var.encoding = {}
    for name in ds.data_vars:
        ds[name].attrs = dict(train[name].attrs)
    ds.to_zarr(store, group=CLIMATOLOGY_GROUP, mode="w", consolidated=False, zarr_format=2)
    return {
        "train_start": iso(train.time.values[0]),
        "train_end": iso(train.time.values[-1]),
        "steps": int(train.sizes["time"]),
        "hours": [int(h) for h in ds["hour"].values],
        "variables": [str(v) for v in ds.data_vars],
    }


def read_climatology(
    path: str | os.PathLike[str],
    variables: Sequence[str],
    time: Any,
    hours: np.ndarray,
    record: dict[str, Any] | None,
    storage_options: dict[str, Any] | None = None,
    region: dict[str, slice] | None = None,
    west: float | None = None,
) -> dict[str, np.ndarray] | None:
    """``{variable: [24, H * W]}`` (the ``region`` of it, a global store's columns from ``west`` as the DataModules
    read it) from the store's climatology group, or None unless
    ``record`` (the store's ``attrs[CLIMATOLOGY_ATTR]``) covers every variable, all 24 hours, and exactly the
    training hours ``hours`` (indices into the store's ``time`` index)."""
    if not record or len(hours) == 0:
        return None
    if not set(variables) <= set(record.get("variables", [])) or sorted(record.get("hours", [])) != list(range(24)):
        return None
    first, last = iso(time[hours[0]]), iso(time[hours[-1]])
    if (record.get("train_start"), record.get("train_end"), record.get("steps")) != (first, last, len(hours)):
        return None
    ds = xr.open_zarr(str(path), group=CLIMATOLOGY_GROUP, storage_options=storage_options, chunks=None)
    ds = columns_as_read(ds.sortby("hour"), west)  # in the columns' order the DataModules read the store in
    if region:
        ds = ds.isel(region)
    out = {}
    for v in variables:
        values = ds[v].values
        if values.ndim != 3:
            return None  # a level dimension: the station task takes 2-D variables only
        out[v] = values.reshape(24, -1).astype(np.float32)
    return out


def computed_climatology(
    ds: xr.Dataset, variables: Sequence[str], hours: np.ndarray, where: str
) -> dict[str, np.ndarray]:
    """``{variable: [24, H * W]}``: the mean of ``ds``'s 2-D ``variables`` at each grid point and UTC hour of day over
    the steps ``hours`` (indices into ``ds.time``), read a chunk at a time; ``where`` (the training dates and store)
    names what lacks an hour of day."""
    hour_of_day = ds.indexes["time"].hour.to_numpy()[hours]
    missing = sorted(set(range(24)) - set(hour_of_day.tolist()))
    if missing:
        raise DataError(
            f"{where}: climatology needs every hour of day among the training hours; hours {missing} have none. Use "
            "a store with hourly data or set climatology: false."
        )
    out = {}
    for v in variables:
        field = ds[v].chunk({"time": time_chunk(ds[v])})  # streamed a chunk at a time, never whole
        field = field.isel(time=xr.DataArray(hours, dims="time"))
        field = field.assign_coords(time=("time", hour_of_day)).groupby("time").mean().values  # [24, H, W]
        out[v] = field.reshape(24, -1).astype(np.float32)
    return out
