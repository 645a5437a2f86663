"""Reading a large archive such as the public ARCO-ERA5 Zarr store: variable names, levels, dates and a region.

ARCO-ERA5 (``gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3``, anonymous access, needs the
``cloud`` extra: ``pip install gridtnp[cloud]``) names its variables in words (``2m_temperature``), has a ``level``
dimension (hPa) on atmospheric variables, latitudes from 90 to -90, longitudes from 0 to 359.75 and one time step
per chunk. ``gridtnp data prepare`` takes its variables by either name of ``NAMES`` and writes the short one:

* ``t2m`` or ``2m_temperature``: that variable; ``u850`` (short name + level) or ``u_component_of_wind@850``: the
  level-850 field of ``u_component_of_wind`` as a 2-D variable ``u850``; ``u`` with ``--levels 500 850``: the
  variable ``u`` with its level dimension cut to those levels.

* ``NAMES``: archive name -> short name (the table in docs/data.md); ``resolve(ds, requested)``: what each requested
  name reads (``Pick``); ``raw_variables(picks)``: the archive variables to keep before normalising.
* ``select_part(ds, picks, levels, start, end, region)``: one normalised input cut to the request, lazily;
  ``parse_region(text)``: ``"lat_min,lat_max,lon_min,lon_max"`` -> floats (``lon_min > lon_max``: across the date
  line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from gridtnp.data.layout import DIMS, DataError, date_bounds

# Archive (ARCO-ERA5 / CDS long) name -> ERA5 short name. Surface variables first, then pressure-level ones.
NAMES: dict[str, str] = {
    "2m_temperature": "t2m",
    "2m_dewpoint_temperature": "d2m",
    "skin_temperature": "skt",
    "sea_surface_temperature": "sst",
    "10m_u_component_of_wind": "u10",
    "10m_v_component_of_wind": "v10",
    "100m_u_component_of_wind": "u100",
    "100m_v_component_of_wind": "v100",
    "mean_sea_level_pressure": "msl",
    "surface_pressure": "sp",
    "total_precipitation": "tp",
    "total_cloud_cover": "tcc",
    "total_column_water_vapour": "tcwv",
    "boundary_layer_height": "blh",
    "land_sea_mask": "lsm",
    "geopotential_at_surface": "z_sfc",
    "temperature": "t",
    "u_component_of_wind": "u",
    "v_component_of_wind": "v",
    "geopotential": "z",
    "specific_humidity": "q",
    "relative_humidity": "r",
    "vertical_velocity": "w",
}
SHORT_TO_ARCHIVE = {short: long for long, short in NAMES.items()}
LEVEL_DIMS = ("level", "pressure_level", "isobaricInhPa", "plev")
_LEVEL_NAME = re.compile(r"^([a-z]+)(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Pick:
    """One requested variable: the input's variable ``source``, one ``level`` of it (or None) and the name written."""

    source: str
    level: float | None
    name: str


def _find(ds: xr.Dataset, name: str) -> str | None:
    """The variable of ``ds`` called ``name``, by either of its names."""
    for candidate in (name, SHORT_TO_ARCHIVE.get(name), NAMES.get(name)):
        if candidate is not None and candidate in ds.data_vars:
            return candidate
    return None


def resolve(ds: xr.Dataset, requested: Sequence[str], where: str) -> list[Pick]:
    """What each name of ``requested`` reads from ``ds`` (a raw, un-normalised input), or a DataError naming the
    available variables."""
    picks = []
    for name in requested:
        var, _, level_text = str(name).partition("@")
        found = _find(ds, var)
        level: float | None = None
        if level_text:
            level = float(level_text)
        elif found is None and (match := _LEVEL_NAME.match(var)) is not None:
            found, level = _find(ds, match.group(1)), float(match.group(2))
        if found is None:
            available = ", ".join(f"{v} ({NAMES[v]})" if v in NAMES else str(v) for v in list(ds.data_vars)[:40])
            raise DataError(
                f"{where}: no variable {name!r}; available: {available}. Name variables by their archive or short "
                "name (2m_temperature or t2m; u850 or u_component_of_wind@850 for one level)."
            )
        short = NAMES.get(found, found)
        if level is not None:
            dim = level_dim(ds[found])
            if dim is None:
                raise DataError(f"{where}: variable {found!r} has no level dimension; write {short!r}, not {name!r}.")
            if not np.isclose(ds[dim].values.astype(np.float64), level).any():
                have = ", ".join(f"{v:g}" for v in ds[dim].values)
                raise DataError(f"{where}: variable {found!r} has no level {level:g} ({dim}: {have}).")
            picks.append(Pick(found, level, f"{short}{level:g}"))
        else:
            picks.append(Pick(found, None, short))
    names = [p.name for p in picks]
    if len(set(names)) != len(names):
        raise DataError(f"{where}: variables {list(requested)} name a variable twice ({names}).")
    return picks


def level_dim(var: xr.DataArray) -> str | None:
    """The level dimension of ``var`` (``level``, ``pressure_level``, ...), or None."""
    return next((str(d) for d in var.dims if str(d) in LEVEL_DIMS), None)


def raw_variables(picks: Sequence[Pick]) -> list[str]:
    """The input variables the picks read, once each."""
    return list(dict.fromkeys(p.source for p in picks))


def parse_region(text: str | Sequence[float]) -> tuple[float, float, float, float]:
    """``"lat_min,lat_max,lon_min,lon_max"`` (or four numbers) -> floats; ``lon_min > lon_max`` crosses the date
    line (e.g. ``"-50,10,160,-160"``); longitudes in [-180, 180) or [0, 360)."""
    values = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    try:
        lat_min, lat_max, lon_min, lon_max = (float(v) for v in values)
    except ValueError as err:
        raise DataError(f"--region {text!r}: expected lat_min,lat_max,lon_min,lon_max in degrees.") from err
    if not -90 <= lat_min <= lat_max <= 90:
        raise DataError(f"--region {text!r}: expected -90 <= lat_min <= lat_max <= 90.")
    return lat_min, lat_max, lon_min, lon_max


def select_part(
    ds: xr.Dataset,
    picks: Sequence[Pick],
    levels: Sequence[float] | None = None,
    start: str | None = None,
    end: str | None = None,
    region: tuple[float, float, float, float] | None = None,
) -> xr.Dataset:
    """One normalised input (``gridtnp.data.layout.normalise``) cut to the request, lazily: the picked variables
    (one level as a 2-D variable, or ``levels`` of a level dimension), times in [start, end] (inclusive, whole days
    for dates; may be empty), and the ``region`` (a box across the date line keeps both sides, longitudes
    ascending)."""
    if start is not None or end is not None:
        first = date_bounds(start, "--start")[0] if start is not None else None
        last = date_bounds(end, "--end")[1] if end is not None else None
        ds = ds.sel(time=slice(first, last))
    if region is not None:
        ds = _select_region(ds, region)
    out = {}
    for p in picks:
        var = ds[p.source]
        dim = level_dim(var)
        if p.level is not None and dim is not None:
            index = int(np.flatnonzero(np.isclose(var[dim].values.astype(np.float64), p.level))[0])
            var = var.isel({dim: index}, drop=True)
        elif dim is not None and levels is not None:
            values = var[dim].values.astype(np.float64)
            keep = [int(np.flatnonzero(np.isclose(values, lv))[0]) for lv in levels if np.isclose(values, lv).any()]
            if len(keep) != len(levels):
                have = ", ".join(f"{v:g}" for v in values)
                raise DataError(f"variable {p.source!r}: --levels {list(levels)} not all in {dim} ({have}).")
            var = var.isel({dim: keep})
        var = var.rename(p.name)
        extra = [d for d in var.dims if d not in DIMS]
        var = var.transpose("time", *extra, "latitude", "longitude")
        out[p.name] = var
    return xr.Dataset(out, attrs=ds.attrs)


def _select_region(ds: xr.Dataset, region: tuple[float, float, float, float]) -> xr.Dataset:
    lat_min, lat_max, lon_min, lon_max = region
    lat = ds["latitude"].values
    keep_lat = (lat >= lat_min) & (lat <= lat_max)
    lon = ds["longitude"].values
    lo, hi = ((v + 180.0) % 360.0 - 180.0 for v in (lon_min, lon_max))
    if lon_max - lon_min >= 360.0:
        keep_lon = np.ones(len(lon), bool)
    elif lo <= hi:
        keep_lon = (lon >= lo) & (lon <= hi)
    else:  # across the date line: east of lon_min or west of lon_max
        keep_lon = (lon >= lo) | (lon <= hi)
    if not keep_lat.any() or not keep_lon.any():
        raise DataError(
            f"--region {region}: no grid point inside (the input covers latitude {lat.min():g} to {lat.max():g}, "
            f"longitude {lon.min():g} to {lon.max():g})."
        )
    return ds.isel(latitude=np.flatnonzero(keep_lat), longitude=np.flatnonzero(keep_lon))
