"""``gridtnp predict`` outputs of the ERA5 DataModules as CF ``xarray.Dataset``s in physical units.

* ``station_predictions(outputs, ...)``: ``mean``, ``std`` on ``(time, station)`` with station coordinates and
  ``observed``, ``is_context``; or, with a prediction grid, on ``(time, latitude, longitude)``.
* ``forecast_predictions(outputs, ...)``: forecasts on ``(init_time, lead_time, station)``.
* ``window_predictions(outputs, ...)``: ``<variable>_mean``, ``<variable>_std`` on ``(time, latitude, longitude)``;
  for forecasts, on ``(init_time, lead_time, latitude, longitude)``.
* ``Variable``: a predicted variable's name, description, units and normalisation ``(mean, std)``.

``outputs`` are the module's prediction steps: ``mean``, ``std``, ``y`` ``[B, P, Dy]``, ``mask`` ``[B, P]`` and the
batch's extras (``hour [B]``, ``is_context [B, P]``; ``start_hour [B]``; test batches also ``coarse_sq_err [B, P]``,
written as ``baseline_sq_error``), in normalised units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import xarray as xr

Dims = tuple[str, ...]


class Variable(NamedTuple):
    """A predicted variable: ``name``, ``description`` (for long names), ``units``, normalisation ``mean``, ``std``."""

    name: str
    description: str
    units: str
    mean: float
    std: float


def station_predictions(
    outputs: Sequence[dict[str, torch.Tensor]],
    time_axis: pd.Index,
    variable: Variable,
    stations: pd.DataFrame,
    points: tuple[np.ndarray, np.ndarray] | None,
    store: str,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """Station + reanalysis outputs -> ``mean``, ``std`` on ``(time, station)`` (``stations``' coordinates, plus
    ``observed`` and ``is_context``), or on ``(time, latitude, longitude)`` for prediction ``points`` ``(lat [H],
    lon [W])``; ``time_axis[hour]`` gives the times, ``attrs`` are added to the dataset's."""
    mean = torch.cat([o["mean"][..., 0] for o in outputs]).double().numpy()  # [T, P]
    std = torch.cat([o["std"][..., 0] for o in outputs]).double().numpy()
    time = time_axis[torch.cat([o["hour"] for o in outputs]).numpy()]
    if points is not None:
        lat, lon = points
        dims: Dims = ("time", "latitude", "longitude")
        coords: dict[str, Any] = {"time": time, "latitude": lat, "longitude": lon}
        return _cf_dataset(_physical(variable, mean, std, dims, (len(time), len(lat), len(lon))), coords, store, attrs)
    dims = ("time", "station")
    coords = {
        "time": time,
        "station": np.arange(len(stations)),
        "latitude": ("station", stations["latitude"].to_numpy(np.float64)),
        "longitude": ("station", stations["longitude"].to_numpy(np.float64)),
    }
    if "station_id" in stations:
        coords["station_id"] = ("station", stations["station_id"].astype(str).to_numpy())
    observed = torch.cat([o["y"][..., 0] for o in outputs]).double().numpy() * variable.std + variable.mean
    valid = torch.cat([o["mask"] for o in outputs]).numpy()
    data = _physical(variable, mean, std, dims, mean.shape)
    data["observed"] = (
        dims,
        np.where(valid, observed, np.nan),
        {"units": variable.units, "long_name": f"{variable.description} (ERA5 at the station)"},
    )
    if "coarse_sq_err" in outputs[0]:  # test batches: the coarse-cell baseline's squared error at each target
        sq_err = torch.cat([o["coarse_sq_err"] for o in outputs]).double().numpy() * variable.std**2
        data["baseline_sq_error"] = (
            dims,
            np.where(valid, sq_err, np.nan),
            {"units": f"{variable.units}2", "long_name": "squared error of the coarse cell's value (baseline)"},
        )
    data["is_context"] = (
        dims,
        torch.cat([o["is_context"] for o in outputs]).numpy().astype(np.int8),
        {"long_name": "station was in the context set", "flag_values": [0, 1]},
    )
    return _cf_dataset(data, coords, store, attrs)


def forecast_predictions(
    outputs: Sequence[dict[str, torch.Tensor]], datamodule: Any, variable: Variable, attrs: dict[str, Any]
) -> xr.Dataset:
    """Forecast outputs of ``datamodule`` (a ``StationReanalysisDataModule`` with ``lead_hours``; targets lead-major,
    ``[B, L * S]``) -> ``mean``, ``std``, ``observed``, ``baseline_sq_error``, ``is_context`` on ``(init_time,
    lead_time, station)``, with CF's ``forecast_reference_time`` and ``forecast_period`` coordinates and the valid
    ``time [init_time, lead_time]``; with a climatology, it is added back at each valid hour."""
    task, leads, time_axis = datamodule.task, datamodule.lead_hours, datamodule.time_axis
    init = time_axis[torch.cat([o["hour"] for o in outputs]).numpy()]
    shape = (len(init), len(leads), len(datamodule.station_table))

    def joined(key: str) -> np.ndarray:
        """``[T, L, S]`` of the outputs' ``key`` (``[B, L * S]`` or ``[B, L * S, 1]`` each)."""
        values = torch.cat([o[key][..., 0] if o[key].dim() == 3 else o[key] for o in outputs])
        return values.double().numpy().reshape(shape)

    mean, std, y, valid = joined("mean"), joined("std"), joined("y"), joined("mask") > 0
    coords, valid_time = _forecast_coords(init, leads)
    if datamodule.climatology:  # departures -> values at each valid hour (normalised units)
        at = time_axis.get_indexer(pd.DatetimeIndex(valid_time.ravel())).reshape(valid_time.shape)
        reference = np.stack([task.reference(variable.name, at[:, j], task.station_flat) for j in range(len(leads))], 1)
        shift = (reference - variable.mean) / variable.std
        mean, y = mean + shift, y + shift
    dims: Dims = ("init_time", "lead_time", "station")
    data = _physical(variable, mean, std, dims, shape)
    observed = {"units": variable.units, "long_name": f"{variable.description} (ERA5 at the station)"}
    data["observed"] = (dims, np.where(valid, y * variable.std + variable.mean, np.nan), observed)
    if "coarse_sq_err" in outputs[0]:
        sq_err = np.where(valid, joined("coarse_sq_err") * variable.std**2, np.nan)
        long_name = "squared error of the coarse cell's value at the grid hour (baseline)"
        data["baseline_sq_error"] = (dims, sq_err, {"units": f"{variable.units}2", "long_name": long_name})
    flags = {"long_name": "station was in the context set", "flag_values": [0, 1]}
    data["is_context"] = (dims, joined("is_context").astype(np.int8), flags)
    stations = datamodule.station_table
    coords |= {
        "station": np.arange(len(stations)),
        "latitude": ("station", stations["latitude"].to_numpy(np.float64)),
        "longitude": ("station", stations["longitude"].to_numpy(np.float64)),
    }
    if "station_id" in stations:
        coords["station_id"] = ("station", stations["station_id"].astype(str).to_numpy())
    return _forecast_encoding(_cf_dataset(data, coords, datamodule.store_path(), {**attrs, "lead_hours": list(leads)}))


def _forecast_coords(init: pd.DatetimeIndex, leads: Sequence[int]) -> tuple[dict[str, Any], np.ndarray]:
    """CF coordinates ``init_time [T]`` (``forecast_reference_time``), ``lead_time [L]`` (``forecast_period``) and
    the valid ``time [T, L]``, and that valid time."""
    lead = pd.to_timedelta(np.asarray(leads), unit="h")
    valid_time = init.to_numpy()[:, None] + lead.to_numpy()[None]  # [T, L]
    coords = {
        "init_time": ("init_time", init, {"standard_name": "forecast_reference_time", "long_name": "initial time"}),
        "lead_time": ("lead_time", lead, {"standard_name": "forecast_period", "long_name": "lead time"}),
        "time": (("init_time", "lead_time"), valid_time, {"standard_name": "time", "long_name": "valid time"}),
    }
    return coords, valid_time


def _forecast_encoding(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with ``init_time`` in hours since 1900 and ``lead_time`` in hours when written."""
    ds["init_time"].encoding.update({"units": "hours since 1900-01-01 00:00:00", "calendar": "standard"})
    ds["lead_time"].encoding.update({"units": "hours"})
    return ds


def window_predictions(
    outputs: Sequence[dict[str, torch.Tensor]],
    time_axis: pd.Index,
    window: int,
    box: tuple[np.ndarray, np.ndarray],
    variables: Sequence[Variable],
    store: str,
    attrs: dict[str, Any],
    lead_hours: Sequence[int] = (),
) -> xr.Dataset:
    """Multi-source outputs (windows of ``window`` hours over ``box = (lat [H], lon [W])``, output ``j`` =
    ``variables[j]``) -> ``<name>_mean``, ``<name>_std`` on ``(time, latitude, longitude)``; ``attrs`` are added.
    Forecasts (``lead_hours``; each task's targets every point at each lead, lead-major, from the initial hour
    ``start_hour``): on ``(init_time, lead_time, latitude, longitude)`` with the CF coordinates of
    ``forecast_predictions``."""
    lat, lon = box
    start = torch.cat([o["start_hour"] for o in outputs]).numpy()
    mean = torch.cat([o["mean"] for o in outputs]).double().numpy()  # [windows, P, Dy]
    std = torch.cat([o["std"] for o in outputs]).double().numpy()
    if lead_hours:
        dims: Dims = ("init_time", "lead_time", "latitude", "longitude")
        shape: tuple[int, ...] = (len(start), len(lead_hours), len(lat), len(lon))
        coords, _ = _forecast_coords(time_axis[start], lead_hours)
        attrs = {**attrs, "lead_hours": list(lead_hours)}
    else:
        dims, shape = ("time", "latitude", "longitude"), (-1, len(lat), len(lon))
        coords = {"time": time_axis[(start[:, None] + np.arange(window)).reshape(-1)]}
    data = {}
    for j, variable in enumerate(variables):
        fields = _physical(variable, mean[..., j], std[..., j], dims, shape)
        data.update({f"{variable.name}_{kind}": field for kind, field in fields.items()})
    ds = _cf_dataset(data, {**coords, "latitude": lat, "longitude": lon}, store, attrs)
    return _forecast_encoding(ds) if lead_hours else ds


def _physical(
    variable: Variable, mean: np.ndarray, std: np.ndarray, dims: Dims, shape: Sequence[int]
) -> dict[str, tuple[Dims, np.ndarray, dict[str, str]]]:
    """``{"mean": ..., "std": ...}`` data variables: normalised predictions in ``variable``'s units, reshaped."""
    out = {}
    for kind, values in (("mean", mean * variable.std + variable.mean), ("std", std * variable.std)):
        long_name = f"predictive {'mean' if kind == 'mean' else 'standard deviation'} of {variable.description}"
        out[kind] = (dims, values.reshape(shape), {"units": variable.units, "long_name": long_name})
    return out


def _cf_dataset(data: dict[str, Any], coords: dict[str, Any], store: str, attrs: dict[str, Any]) -> xr.Dataset:
    ds = xr.Dataset(data, coords=coords)
    ds["latitude"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
    ds["longitude"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
    ds.attrs.update({"Conventions": "CF-1.8", "source": f"gridtnp predictions from the store {store}", **attrs})
    return ds
