"""Predictions as CF-1.10 datasets: station time series (discrete sampling geometry) or gridded maps.

``cf_predictions(ds, names, attribution)`` is the one place where predictions become what a user opens: both
``gridtnp predict`` (``PredictionWriter``, on what the DataModule's ``predictions_to_xarray`` gives) and the
Python API ``gridtnp.inference.predict`` pass their predictions through it.

* Station targets (a dimension along which ``latitude`` and ``longitude`` vary, no per-point ``time``) become CF's
  orthogonal multidimensional array representation: ``featureType: timeSeries``, values on ``(station, time)``,
  the station dimension's coordinate the string identifiers with ``cf_role: timeseries_id`` (a ``station_id``
  coordinate where the data has one, else the location as ISO 6709, ``+51.500-000.250``), ``latitude``,
  ``longitude`` (and ``elevation``) per station.
* A map (``latitude`` and ``longitude`` dimensions) stays on ``(time, latitude, longitude)``.
* The predictive mean is named for its variable (``mean`` -> ``t2m``, ``t2m_mean`` -> ``t2m``), its standard
  deviation ``<variable>_std``; both float32, with ``standard_name`` where CF has one (``standard_error`` for the
  std), ``units`` and ``long_name``. Flag variables get ``flag_meanings`` beside ``flag_values``.
* ``attribution`` (the input data's global attributes) is carried over: ``license``, ``institution``,
  ``references``, ... as they are, the input's ``title`` and ``source`` in ``source`` after ``gridtnp predictions``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

CONVENTIONS = "CF-1.10"
#: CF standard names of common (ERA5 short) variable names; a name with a level suffix (``t850``) takes its stem's.
STANDARD_NAMES = {
    "t2m": "air_temperature",
    "2t": "air_temperature",
    "t": "air_temperature",
    "d2m": "dew_point_temperature",
    "2d": "dew_point_temperature",
    "u10": "eastward_wind",
    "v10": "northward_wind",
    "u": "eastward_wind",
    "v": "northward_wind",
    "msl": "air_pressure_at_mean_sea_level",
    "sp": "surface_air_pressure",
    "z": "geopotential",
    "q": "specific_humidity",
    "r": "relative_humidity",
    "tp": "precipitation_amount",
    "sst": "sea_surface_temperature",
    "tcc": "cloud_area_fraction",
}
#: Global attributes of the input data carried over as they are.
ATTRIBUTION = (
    "institution", "references", "license", "licence", "acknowledgement", "acknowledgment", "citation",
    "creator_name", "creator_url", "publisher_name", "publisher_url", "project",
)  # fmt: skip
#: ``flag_meanings`` of the flag variables gridtnp writes, by name.
FLAG_MEANINGS = {"is_context": "held_out context"}
#: Time encoding of every prediction file (ERA5's own reference time).
TIME_UNITS = "hours since 1900-01-01 00:00:00"


def cf_predictions(
    ds: xr.Dataset, names: Sequence[str] | None = None, attribution: Mapping[str, Any] | None = None
) -> xr.Dataset:
    """``ds`` (``mean``/``std`` or ``<variable>_mean``/``<variable>_std`` and other variables, physical units) as a
    CF-1.10 dataset: variables named for ``names`` (the predicted variables, in output order), float32,
    standard names, station time series or a map, ``attribution``'s global attributes carried over."""
    ds = _renamed(ds, list(names or []))
    instance = station_dimension(ds)
    if instance is not None:
        ds = _stations(ds, instance)
    for name in list(ds.data_vars):
        var = ds[name]
        if np.issubdtype(var.dtype, np.floating) and var.dtype != np.float32:
            ds[name] = var.astype(np.float32)
        ds[name].attrs = _described(name, ds, dict(var.attrs))
    for axis, units in (("latitude", "degrees_north"), ("longitude", "degrees_east")):
        if axis in ds.variables:
            ds[axis].attrs.update({"standard_name": axis, "long_name": axis, "units": units})
    if "time" in ds.variables and np.issubdtype(ds["time"].dtype, np.datetime64):
        ds["time"].attrs.update({"standard_name": "time", "long_name": "time"})
        ds["time"].encoding.update({"units": TIME_UNITS, "calendar": "standard"})
    attrs = dict(ds.attrs)
    attrs["Conventions"] = CONVENTIONS
    if instance is not None:
        attrs["featureType"] = "timeSeries" if "time" in ds.dims else "point"
    attrs.update(_attribution(attrs.get("source", "gridtnp predictions"), attribution or {}))
    ds.attrs = attrs
    return ds


def prediction_dataset(
    mean: np.ndarray,
    std: np.ndarray,
    spanning: xr.DataArray,
    batch_dim: str | None,
    time: xr.DataArray | None,
    names: Sequence[str],
    described: Sequence[Mapping[str, str]],
    is_context: np.ndarray | None,
    attribution: Mapping[str, Any],
) -> xr.Dataset:
    """``predict``'s result: ``mean``, ``std`` ``[B, N, Dy]`` on ``batch_dim`` (coordinate ``time``; a scalar time
    without ``batch_dim``) and the dims of the targets' ``spanning`` template, ``described`` giving each output's
    ``units``/``long_name``, ``is_context [B, N]`` flagging targets that were context points, through
    ``cf_predictions``."""
    b, dy = mean.shape[0], mean.shape[-1]
    dims = [batch_dim] * bool(batch_dim) + list(spanning.dims)
    shape = [b] * bool(batch_dim) + [spanning.sizes[d] for d in spanning.dims]
    data = {}
    for name, values in (("mean", mean), ("std", std)):
        for j in range(dy):
            attrs = dict(described[j])
            if attrs:
                kind = "mean" if name == "mean" else "standard deviation"
                attrs["long_name"] = f"predictive {kind} of {attrs['long_name']}"
            data[name if dy == 1 else f"{name}_{j}"] = (dims, values[..., j].reshape(shape), attrs)
    if is_context is not None and "latitude" not in spanning.dims:  # point targets, not a map
        flags = {"long_name": "target was a context point of the target source", "flag_values": [0, 1]}
        data["is_context"] = (dims, is_context.reshape(shape).astype(np.int8), flags)
    coords = {k: v for k, v in spanning.coords.items() if set(v.dims) <= set(spanning.dims)}
    if time is not None and (time.ndim == 0 or (batch_dim is not None and time.dims == (batch_dim,))):
        coords[batch_dim if time.ndim else "time"] = (time.dims, time.values)
    ds = xr.Dataset(data, coords=coords, attrs={"source": "gridtnp.inference.predict"})
    return cf_predictions(ds, names, attribution)


def context_flags(module: Any, batch: Any) -> np.ndarray | None:
    """``[B, N]``: whether each target is a context point of the model's target source (a context station asked for
    again); None where the model names no target source among the batch's context."""
    from gridtnp.module import observed_targets

    source = getattr(module, "target_source", None) or getattr(getattr(module, "model", module), "target_source", None)
    if source is None or source not in batch.context:
        return None
    return observed_targets(batch, source).cpu().numpy()


def station_dimension(ds: xr.Dataset) -> str | None:
    """The dimension of station targets: the one dimension ``latitude`` and ``longitude`` both lie along, when it is
    not theirs (a map), points do not carry their own ``time`` and no location comes twice (points scattered in
    time, such as a multi-source window's)."""
    if "latitude" not in ds.coords or "longitude" not in ds.coords:
        return None
    lat, lon = ds["latitude"], ds["longitude"]
    if lat.ndim != 1 or lat.dims != lon.dims or lat.dims[0] in ("latitude", "longitude"):
        return None
    if "time" in ds.coords and ds["time"].ndim == 1 and ds["time"].dims == lat.dims:
        return None
    pairs = np.stack([lat.values, lon.values], -1)
    if len(np.unique(pairs, axis=0)) < len(pairs):  # a location twice: points in time or levels, not stations
        return None
    return str(lat.dims[0])


def station_ids(ds: xr.Dataset, dim: str) -> np.ndarray:
    """String identifiers ``[S]`` of the stations along ``dim``: a ``station_id`` coordinate, else ``dim``'s own
    coordinate when it holds names, else each station's location as ISO 6709 (``+51.500-000.250``)."""
    for name in ("station_id", dim):
        if name in ds.coords and ds[name].dims == (dim,) and not np.issubdtype(ds[name].dtype, np.number):
            return ds[name].values.astype(str).astype(object)
    lat, lon = ds["latitude"].values.astype(np.float64), ds["longitude"].values.astype(np.float64)
    return np.array([f"{a:+07.3f}{o:+08.3f}" for a, o in zip(lat, lon, strict=True)], dtype=object)


def _renamed(ds: xr.Dataset, names: list[str]) -> xr.Dataset:
    """``mean``/``std`` (or ``mean_<j>``/``std_<j>``) -> ``names[j]``/``<names[j]>_std``; ``<v>_mean`` -> ``<v>``."""
    renames: dict[str, str] = {}
    for name in ds.data_vars:
        match = re.fullmatch(r"(mean|std)(?:_(\d+))?", str(name))
        if match and names:
            j = int(match.group(2) or 0)
            if j < len(names) and (match.group(2) is not None or len(names) == 1):
                renames[str(name)] = names[j] if match.group(1) == "mean" else f"{names[j]}_std"
        elif str(name).endswith("_mean") and ds[name].attrs.get("long_name", "").startswith("predictive mean"):
            renames[str(name)] = str(name).removesuffix("_mean")
    taken = set(ds.variables) - set(renames)
    return ds.rename({k: v for k, v in renames.items() if v not in taken})


def _stations(ds: xr.Dataset, dim: str) -> xr.Dataset:
    """Stations along ``dim`` with string ids as its coordinate (``cf_role: timeseries_id``), first dimension."""
    ids = station_ids(ds, dim)
    ds = ds.drop_vars([n for n in ("station_id", dim) if n in ds.coords])
    ds = ds.assign_coords({dim: (dim, ids, {"cf_role": "timeseries_id", "long_name": "station identifier"})})
    if "elevation" in ds.coords:
        ds["elevation"].attrs.update({"standard_name": "surface_altitude", "units": "m", "positive": "up"})
    return ds.transpose(dim, ...)


def _described(name: str, ds: xr.Dataset, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` of data variable ``name`` with its CF standard name (the std's with ``standard_error``), the link
    from a mean to its std, and ``flag_meanings``."""
    base = name.removesuffix("_std")
    if name == "observed":  # the predicted variable's value at the station
        base = next((str(v) for v in ds.data_vars if f"{v}_std" in ds.data_vars), "")
    standard = STANDARD_NAMES.get(base) or STANDARD_NAMES.get(re.sub(r"\d+$", "", base))
    if standard and "standard_name" not in attrs and not name.startswith("baseline"):
        attrs["standard_name"] = f"{standard} standard_error" if name.endswith("_std") else standard
    if f"{name}_std" in ds.data_vars:
        attrs["ancillary_variables"] = f"{name}_std"
    if "flag_values" in attrs:
        attrs["flag_values"] = np.asarray(attrs["flag_values"], dtype=ds[name].dtype)
        if "flag_meanings" not in attrs:
            attrs["flag_meanings"] = FLAG_MEANINGS.get(name) or " ".join(
                f"value_{v}" for v in np.atleast_1d(attrs["flag_values"])
            )
    return attrs


def _attribution(source: Any, given: Mapping[str, Any]) -> dict[str, str]:
    """Global attributes for the output: ``source`` naming gridtnp then the input's title and source, and the
    input's licence, institution, references, ... as they are."""
    out = {k: str(given[k]) for k in ATTRIBUTION if k in given and str(given[k]).strip()}
    parts = [str(source)] + [f"input {k}: {given[k]}" for k in ("title", "source") if str(given.get(k, "")).strip()]
    out["source"] = "; ".join(dict.fromkeys(parts))
    return out


def attribution_of(*objects: Any) -> dict[str, Any]:
    """The attribution attributes (``title``, ``source``, licence, ...) of xarray objects, the first found of each."""
    out: dict[str, Any] = {}
    for obj in objects:
        attrs = obj.attrs if isinstance(obj, xr.DataArray | xr.Dataset) else obj if isinstance(obj, Mapping) else {}
        for key in ("title", "source", *ATTRIBUTION):
            if key in attrs and key not in out:
                out[key] = attrs[key]
    return out
