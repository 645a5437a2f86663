"""The prepared layout every gridtnp store is in, and what reading and preparing one share.

A prepared store holds variables ``[time, ..., latitude, longitude]`` (``DIMS`` first and last two), latitudes
ascending, longitudes ascending in [-180, 180), ``time`` as datetime64; ``attrs[STATS_ATTR]`` holds each variable's
training-period mean and std and ``attrs[PROVENANCE_ATTR]`` the sources and the command.

* ``normalise(ds)``: any gridded dataset (``lat``/``lon``/``valid_time`` spellings, 0-360 longitudes, descending
  latitudes, CF time units) -> the layout, lazily.
* ``select_time(ds, start, end)``, ``date_bounds(date)``: inclusive date ranges; ``coverage(ds)`` describes a
  dataset's extent for error messages; ``iso(t)``: a time as ``2019-03-01T00:00:00``.
* ``wrap_longitude(lon, centre)``: longitudes into ``[centre - 180, centre + 180)``.
* ``DataError``: input data that cannot be used as given.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp.registry import ConfigError

STATS_ATTR = "gridtnp_stats"
PROVENANCE_ATTR = "gridtnp_provenance"
DIMS = ("time", "latitude", "longitude")

DateLike = str | np.datetime64 | pd.Timestamp

# Spellings of the three coordinates that normalise renames (compared in lower case).
COORD_ALIASES: dict[str, tuple[str, ...]] = {
    "time": ("time", "valid_time"),
    "latitude": ("latitude", "lat"),
    "longitude": ("longitude", "lon", "long"),
}


class DataError(ConfigError):
    """Input data that cannot be used as given; the message names the file or variable and what was expected."""


def wrap_longitude(lon: Any, centre: float = 0.0) -> Any:
    """Longitudes in degrees wrapped into ``[centre - 180, centre + 180)``: [-180, 180) by default, one run past
    180 degrees for a box across the date line (``centre`` 170: -170 -> 190); NaN stays NaN."""
    return (np.asarray(lon, dtype=np.float64) - centre + 180.0) % 360.0 - 180.0 + centre


def normalise(ds: xr.Dataset, source: str = "dataset") -> xr.Dataset:
    """Rename coordinates to ``time, latitude, longitude``; time datetime64 and sorted, latitudes ascending,
    longitudes ascending in [-180, 180); drop auxiliary coordinates (cfgrib's ``step``, ``number``, ...)."""
    for canonical, aliases in COORD_ALIASES.items():
        ds = _rename_coordinate(ds, canonical, aliases, source)
    ds = ds.reset_coords(drop=True)
    ds = _decode_time(ds, source)

    lon_attrs = dict(ds["longitude"].attrs)
    lon = ds["longitude"].values.astype(np.float64)
    if lon.size and (lon.min() < -180 or lon.max() >= 180):
        ds = ds.assign_coords(longitude=("longitude", wrap_longitude(lon), lon_attrs))
    lat = ds["latitude"].values.astype(np.float64)
    if lat.size and np.nanmax(np.abs(lat)) > 90:
        bad = lat[np.abs(lat) > 90][0]
        raise DataError(f"{source}: latitude {bad:g} is outside [-90, 90]; latitudes are in degrees north.")
    lat_attrs = dict(ds["latitude"].attrs)
    if "stored_direction" in lat_attrs:  # cfgrib's note on the GRIB order, no longer true once sorted
        lat_attrs["stored_direction"] = "increasing"
    for dim in DIMS:
        ds = _ascending(ds, dim)
    ds["latitude"].attrs = lat_attrs
    for dim in DIMS:
        values = ds[dim].values
        if values.size > 1 and not np.all(values[1:] > values[:-1]):
            dup = values[1:][values[1:] == values[:-1]][0]
            hint = " (after wrapping to [-180, 180), e.g. both 0 and 360)" if dim == "longitude" else ""
            raise DataError(f"{source}: duplicate {dim} value {dup}{hint}; expected each {dim} once.")
    return ds


def _ascending(ds: xr.Dataset, dim: str) -> xr.Dataset:
    """``ds`` sorted along ``dim``. Reversed axes (descending latitudes) are flipped with a slice and rotated ones
    (0-360 longitudes after wrapping) rolled, which on dask arrays is a relabelling of blocks instead of the index
    array of a sort that every read would gather through; anything else is sorted."""
    values = ds[dim].values
    if values.size < 2 or bool(np.all(values[1:] > values[:-1])):
        return ds
    if bool(np.all(values[1:] < values[:-1])):
        return ds.isel({dim: slice(None, None, -1)})
    falls = np.flatnonzero(values[1:] < values[:-1])
    on_dask = all(var.chunks is not None for var in ds.data_vars.values() if dim in var.dims)
    if on_dask and len(falls) == 1 and values[-1] < values[0]:
        rotated = np.roll(values, -(falls[0] + 1))
        if bool(np.all(rotated[1:] > rotated[:-1])):
            return ds.roll({dim: -(int(falls[0]) + 1)}, roll_coords=True)
    return ds.sortby(dim)  # lazily indexed arrays: a roll would load them, an index array keeps them lazy


def _rename_coordinate(ds: xr.Dataset, canonical: str, aliases: tuple[str, ...], source: str) -> xr.Dataset:
    if canonical in ds.dims:
        return ds
    found = [name for name in ds.dims if str(name).lower() in aliases]
    if found:
        if canonical in ds.variables:  # e.g. cfgrib's scalar forecast reference `time` beside a `valid_time` dim
            ds = ds.drop_vars(canonical)
        return ds.rename({found[0]: canonical})
    scalar = [name for name in ds.coords if str(name).lower() in aliases and ds[name].ndim == 0]
    if scalar:  # a single time step stored as a scalar coordinate (cfgrib, one-step NetCDF files)
        if scalar[0] != canonical:
            ds = ds.drop_vars([canonical] if canonical in ds.variables else []).rename({scalar[0]: canonical})
        return ds.set_coords(canonical).expand_dims(canonical)
    raise DataError(
        f"{source}: no {canonical} coordinate (looked for {', '.join(aliases)}, any case); found dimensions "
        f"{', '.join(map(str, ds.dims)) or 'none'}. Expected gridded data on time, latitude and longitude."
    )


def _decode_time(ds: xr.Dataset, source: str) -> xr.Dataset:
    time = ds["time"]
    if np.issubdtype(time.dtype, np.datetime64):
        return ds
    index = ds.indexes["time"]
    if isinstance(index, xr.CFTimeIndex):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "converting a non-standard calendar" notice
                return ds.assign_coords(time=("time", index.to_datetimeindex(), time.attrs))
        except Exception as err:
            raise DataError(
                f"{source}: time ({index.calendar} calendar) cannot be converted to datetime64: {err}"
            ) from err
    raise DataError(
        f"{source}: time has dtype {time.dtype} and units {time.attrs.get('units', '(none)')!r}; expected datetime64 "
        "or CF units such as 'hours since 1970-01-01'."
    )


def coverage(ds: xr.Dataset) -> str:
    """What ``ds`` covers, for error messages: time range and steps, latitude and longitude ranges."""
    time = ds.indexes["time"]
    lat, lon = ds["latitude"].values, ds["longitude"].values
    return (
        f"time {iso(time[0])} to {iso(time[-1])} ({len(time)} steps), "
        f"latitude {lat.min():g} to {lat.max():g}, longitude {lon.min():g} to {lon.max():g}"
    )


def select_time(ds: xr.Dataset, start: DateLike | None = None, end: DateLike | None = None) -> xr.Dataset:
    """Lazy subset of ``ds`` with times in [start, end], inclusive at each string's resolution.

    A range reaching outside ``ds``, or holding no time step, is an error naming ``ds``'s coverage.
    """
    time = ds.indexes["time"]
    first, last = time[0], time[-1]
    (s0, s1) = (first, first) if start is None else date_bounds(start, "start")
    (e0, e1) = (last, last) if end is None else date_bounds(end, "end")
    # Outside = a requested start (end) period wholly before (after) the store, or the range missing it entirely.
    if s1 < first or e0 > last or s0 > last or e1 < first:
        raise DataError(
            f"Dates {_describe_range(start, end)} reach outside the store, which covers {coverage(ds)}. "
            "Choose dates inside that range, or prepare a store that covers them."
        )
    if s0 > e1:
        raise DataError(f"Dates: start {start} is after end {end}; expected start <= end.")
    out = ds.sel(time=slice(s0, e1))
    if out.sizes["time"] == 0:
        raise DataError(f"No time steps {_describe_range(start, end)}; the store covers {coverage(ds)}.")
    return out


def date_bounds(value: DateLike, what: str = "date") -> tuple[pd.Timestamp, pd.Timestamp]:
    """First and last instant a date covers: ``"2019-03-21"`` is that whole day, a timestamp is itself."""
    try:
        if isinstance(value, str):
            period = pd.Period(value)
            return period.start_time, period.end_time
        t = pd.Timestamp(value)
    except (ValueError, TypeError) as err:
        raise DataError(f"{what} {value!r} is not a date; expected e.g. '2019-03-21' or '2019-03-21T06'.") from err
    return t, t


def _describe_range(start: DateLike | None, end: DateLike | None) -> str:
    if start is None:
        return f"up to {end}"
    return f"from {start}" if end is None else f"{start} to {end}"


def iso(t: Any) -> str:
    """A time as an ISO 8601 string to the second: ``2019-03-01T00:00:00``."""
    return str(np.datetime_as_string(np.datetime64(t, "s")))
