"""Reading a large archive such as the public ARCO-ERA5 Zarr store: variable names, levels, dates and a region.

ARCO-ERA5 (``gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3``, anonymous access, needs the
``cloud`` extra: ``pip install gridtnp[cloud]``) names its variables in words (``2m_temperature``), has a ``level``
dimension (hPa) on atmospheric variables, latitudes from 90 to -90, longitudes from 0 to 359.75 and one time step
per chunk. ``gridtnp data prepare`` takes its variables by either name of ``NAMES`` and writes the short one:

* ``t2m`` or ``2m_temperature``: that variable; ``u850`` (short name + level) or ``u_component_of_wind@850``: the
  level-850 field of ``u_component_of_wind`` as a 2-D variable ``u850``; ``u`` with ``--levels 500 850``: the
  variable ``u`` with its level dimension cut to those levels.

* ``NAMES``: archive name -> short name (the table in docs/data.md); ``resolve(ds, requested)``: what each requested
  name reads (``Pick``); ``raw_variables(picks)`` and ``level_indices(ds, picks, levels)``: the archive variables
  and levels to keep before normalising.
* ``select_part(ds, picks, levels, start, end, region)``: one normalised input cut to the request, lazily;
  ``parse_region(text)``: ``"lat_min,lat_max,lon_min,lon_max"`` -> floats (``lon_min > lon_max``: across the date
  line); ``valid_dates(attrs, start, end, where)``: the request kept to the hours an archive says hold data.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from gridtnp.data.layout import DIMS, DataError, date_bounds, wrap_longitude

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


def level_indices(ds: xr.Dataset, picks: Sequence[Pick], levels: Sequence[float] | None) -> dict[str, list[int]]:
    """Per level dimension of the picked variables of ``ds``, the indices of the levels they read, in stored order
    (a dimension some pick reads whole is left out); ``levels`` a picked level variable lacks are refused."""
    whole: set[str] = set()
    kept: dict[str, set[int]] = {}
    for p in picks:
        dim = level_dim(ds[p.source])
        if dim is None:
            continue
        if p.level is None and levels is None:
            whole.add(dim)
        else:
            wanted = [p.level] if p.level is not None else levels
            kept.setdefault(dim, set()).update(level_positions(p.source, dim, ds[dim].values, wanted))
    return {dim: sorted(indices) for dim, indices in kept.items() if dim not in whole}


def level_positions(source: str, dim: str, stored: np.ndarray, levels: Sequence[float]) -> list[int]:
    """The positions of ``levels`` on the level axis ``stored`` of variable ``source``; a missing level is refused
    with the levels there are."""
    values = np.asarray(stored, dtype=np.float64)
    found = [np.flatnonzero(np.isclose(values, lv)) for lv in levels]
    missing = [lv for lv, at in zip(levels, found, strict=True) if not len(at)]
    if missing:
        raise DataError(
            f"variable {source!r}: no level {_numbers(missing)} in {dim} (it has {_numbers(values)}); "
            "choose --levels from those."
        )
    return [int(at[0]) for at in found]


def check_levels_taken(ds: xr.Dataset, picks: Sequence[Pick], levels: Sequence[float] | None) -> None:
    """Refuse ``--levels`` that no picked variable of ``ds`` takes: with no level dimension, or with its level named
    (``u850``), a variable keeps nothing by it, and a silently ignored option hides a mistaken request."""
    if levels is None or any(p.level is None and level_dim(ds[p.source]) is not None for p in picks):
        return
    names = ", ".join(p.name for p in picks)
    raise DataError(
        f"--levels {_numbers(levels)}: none of the variables ({names}) takes them; they choose the levels of a "
        "variable with a level dimension named without one (--variables u --levels 500 850). Name one level as "
        "u850 or u_component_of_wind@850, or drop --levels."
    )


def _numbers(values: Sequence[float] | np.ndarray) -> str:
    return ", ".join(f"{float(v):g}" for v in values)


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


# ARCO-ERA5 pads its time axis years past today (the padding reads as NaN) and names the hours that hold data.
VALID_START, VALID_STOP, VALID_STOP_ERA5T = "valid_time_start", "valid_time_stop", "valid_time_stop_era5t"


def valid_dates(
    attrs: Mapping[str, object], start: str | None, end: str | None, where: str
) -> tuple[str | None, str | None]:
    """``(start, end)`` kept to the hours an archive holds data for, by its attributes ``valid_time_start``,
    ``valid_time_stop`` (the last day of final ERA5) and ``valid_time_stop_era5t`` (of preliminary ERA5T, which
    ECMWF may still revise): unset bounds become the final period's, a request outside the data is refused, and
    hours of ERA5T are kept with a warning. Inputs without these attributes are returned as they are."""
    first_text, final_text = (str(attrs[k]) if k in attrs else None for k in (VALID_START, VALID_STOP))
    if first_text is None and final_text is None:
        return start, end
    first = date_bounds(first_text, VALID_START)[0] if first_text is not None else None
    final = date_bounds(final_text, VALID_STOP)[1] if final_text is not None else None
    era5t_text = attrs.get(VALID_STOP_ERA5T)
    era5t = date_bounds(str(era5t_text), VALID_STOP_ERA5T)[1] if era5t_text is not None else None
    held = f"{where} holds data from {first_text or 'its first step'} to {final_text or 'its last step'}"
    if era5t is not None:
        held += f" (preliminary ERA5T to {era5t_text})"
    if first is not None and start is not None and date_bounds(start, "--start")[1] < first:
        raise DataError(f"--start {start}: {held}; its earlier hours are empty. Choose a --start from {first_text}.")
    if end is not None and final is not None and (last := date_bounds(end, "--end")[1]) > final:
        if era5t is None or last > era5t:
            raise DataError(f"--end {end}: {held}; its later hours are empty. Choose an earlier --end.")
        warnings.warn(
            f"--end {end}: the hours after {final_text} are preliminary ERA5T ({where}), which ECMWF may still "
            "revise; prepare those days again once they are final.",
            UserWarning,
            stacklevel=2,
        )
    return (start if start is not None else first_text), (end if end is not None else final_text)


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
    ascending). ``levels`` that no pick takes are refused."""
    check_levels_taken(ds, picks, levels)
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
            var = var.isel({dim: level_positions(p.source, dim, var[dim].values, [p.level])[0]}, drop=True)
        elif dim is not None and levels is not None:
            var = var.isel({dim: level_positions(p.source, dim, var[dim].values, levels)})
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
    lo, hi = (float(wrap_longitude(v)) for v in (lon_min, lon_max))
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
