"""Open prepared Zarr stores lazily and select a date range and region, with errors a user can act on.

A prepared store (``gridtnp data prepare``) is in the layout of ``gridtnp.data.layout``: variables
``[time, ..., latitude, longitude]``, latitudes ascending, longitudes ascending in [-180, 180), normalisation
statistics in ``attrs["gridtnp_stats"]``.

* ``open_store(path_or_url, variables)``: the store as a lazy ``xarray.Dataset``, its layout checked
  (``check_layout``) or, with ``convert_layout``, converted on read; ``time_chunk(var)``: its steps per chunk.
* ``continuous_longitudes(ds)``: a store of a box across the date line (stored as two runs, ``[-180, east]`` and
  ``[west, 180)``) as one run eastward from its western edge, past 180 degrees (``date_line_order``);
  ``longitudes_from(ds, west)``: a global store's columns from ``west`` eastward, past 180 degrees, so that a region
  across the date line is one box of it; ``columns_as_read(ds, west)``: both, as the DataModules read a store.
* ``select(ds, start, end, region)``: a lazy subset in time and a lat/lon box; ``region_index(ds, box)``: the
  index slices of such a box (for ``ChunkCache``).
* ``normalisation_stats(ds, variable, level)``: ``(mean, std)`` of a variable over the training period.
* ``ChunkCache`` (``gridtnp.data.chunk_cache``) reads whole time chunks of a store opened here.
* ``coarsen_fields(fields, factor)``: NaN-aware block means ``[..., H, W] -> [..., ceil(H / f), ceil(W / f)]``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.archive import SHORT_TO_ARCHIVE
from gridtnp.data.inventory import CHUNKS_ATTR, check_chunks
from gridtnp.data.layout import DIMS, STATS_ATTR, DataError, DateLike, coverage, normalise, select_time, wrap_longitude
from gridtnp.files import is_url
from gridtnp.registry import ConfigError

_PREPARE_HINT = (
    "Run `gridtnp data prepare SOURCE --out STORE.zarr` to write a store in gridtnp's layout, or set "
    "`convert_layout: true` on the DataModule to convert a store such as ARCO ERA5 lazily."
)

# fsspec protocol -> the package that implements it, for a helpful message when it is missing.
_PROTOCOL_PACKAGES = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "s3": "s3fs",
    "az": "adlfs",
    "abfs": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
}


def open_store(
    path_or_url: str | os.PathLike[str],
    variables: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    convert_layout: bool = False,
    chunked: bool = True,
    continuous: bool = False,
    west: float | None = None,
) -> xr.Dataset:
    """Open a prepared Zarr store lazily and check its layout: dask arrays of the store's own chunks, or with
    ``chunked=False`` xarray's lazy backend arrays (no task graph; ``time_chunk(var)`` gives the chunking).
    ``continuous``: the longitude columns as the DataModules read them (``columns_as_read``): a store of a box
    across the date line in one run, and a global store from ``west`` eastward, for a region across the date line.

    ``path_or_url`` is a local path or a URL (``gs://...`` needs gcsfs; pass ``storage_options={"token": "anon"}``
    for public buckets). ``variables`` keeps only those data variables; each is ``[time, ..., latitude, longitude]``.
    A store in another layout is an error, unless ``convert_layout``: then coordinates are renamed, latitudes
    flipped and longitudes rotated lazily, as ``gridtnp data prepare`` would (e.g. the public ARCO ERA5 store, with
    latitudes descending and longitudes in [0, 360)), and ``variables`` may be ERA5 short names of the archive's
    (``t2m`` for ``2m_temperature``). The variables are selected and the layout converted before any dask array
    is made: the archive's 1.3 M hourly chunks per variable would otherwise be a graph of minutes and gigabytes.
    """
    source = str(path_or_url)
    if not is_url(source) and not os.path.exists(source):
        raise DataError(f"No Zarr store at {source!r}. {_PREPARE_HINT}")
    try:
        ds = xr.open_zarr(source, chunks=None, storage_options=storage_options)
    except ImportError as err:
        protocol = source.split("://", 1)[0]
        package = _PROTOCOL_PACKAGES.get(protocol, f"the fsspec implementation for {protocol}://")
        raise DataError(f"Opening {source!r} needs {package}: pip install {package} ({err}).") from err
    except FileNotFoundError as err:
        raise DataError(f"No Zarr store at {source!r} ({err}). {_PREPARE_HINT}") from err
    except Exception as err:
        raise DataError(f"{source!r} could not be opened as a Zarr store ({type(err).__name__}: {err}).") from err
    if variables is not None:
        # An archive's long names answer to the short ones when its layout is converted (t2m: 2m_temperature).
        found = {v: v if v in ds.data_vars or not convert_layout else SHORT_TO_ARCHIVE.get(v, v) for v in variables}
        missing = [v for v, name in found.items() if name not in ds.data_vars]
        if missing:
            raise DataError(
                f"{source!r} has no variable(s) {', '.join(map(repr, missing))}; "
                f"available: {', '.join(map(str, ds.data_vars)) or '(none)'}."
            )
        ds = ds[list(found.values())].rename({name: v for v, name in found.items() if name != v})
    recorded = ds.attrs.get(CHUNKS_ATTR)
    if recorded and not is_url(source):  # a local store prepared by gridtnp: every chunk file it wrote is there
        check_chunks(Path(source), {v: n for v, n in recorded.items() if v in ds.data_vars})
    if convert_layout:
        ds = normalise(ds, source)
    check_layout(ds, source)
    if chunked:
        ds = ds.assign({v: var.chunk(var.encoding.get("preferred_chunks", {})) for v, var in ds.data_vars.items()})
    return columns_as_read(ds, west) if continuous else ds


def columns_as_read(ds: xr.Dataset, west: float | None = None) -> xr.Dataset:
    """``ds`` (a store, or its climatology group) with its longitude columns as the DataModules read them: a box
    across the date line in one run (``continuous_longitudes``), and a global store from ``west`` eastward
    (``longitudes_from``) when a region across the date line starts there."""
    ds = continuous_longitudes(ds)
    return longitudes_from(ds, west) if west is not None else ds


def spans_globe(lon: np.ndarray) -> bool:
    """Whether the regular longitudes ``lon`` go all the way round (their step times their count is 360)."""
    return lon.size > 1 and bool(np.isclose(float(np.median(np.diff(lon))) * lon.size, 360.0, rtol=1e-4))


def longitudes_from(ds: xr.Dataset, west: float) -> xr.Dataset:
    """A global ``ds`` with its columns starting at the first longitude at or east of ``west`` and running east past
    180 degrees (``west`` 140 on a 0.25 degree grid: 140, ..., 179.75, 180, ..., 499.75), lazily, so that a box
    from 140 E to 160 W is the box 140 to 200 of it; any other ``ds`` (a regional store) as it is."""
    lon = ds["longitude"].values.astype(np.float64)
    if not spans_globe(lon):
        return ds
    first = int(np.searchsorted(lon, wrap_longitude(west) - 1e-9)) % lon.size
    return _eastward_from(ds, first)


def _eastward_from(ds: xr.Dataset, first: int) -> xr.Dataset:
    """``ds``'s longitude columns from index ``first`` to the end, then from the start, lazily; those that wrapped
    past 180 degrees raised by 360, so the axis ascends in one run."""
    out = ds.isel(longitude=np.r_[first : ds.sizes["longitude"], 0:first])
    lon = out["longitude"].values.astype(np.float64)
    lon[lon < lon[0]] += 360.0
    return out.assign_coords(longitude=("longitude", lon, ds["longitude"].attrs))


def unwrapped_region(region: Sequence[float]) -> tuple[float, float, float, float]:
    """``(lat_min, lat_max, lon_min, lon_max)`` as one run of longitudes eastward from ``lon_min`` taken in
    [-180, 180): a box across the date line (``140, -160``, or in 0-360 degrees ``140, 200``) reads ``140, 200``,
    as the DataModules read such a box; ``180, -170`` reads ``-180, -170``; other boxes as they are."""
    lat_min, lat_max, lon_min, lon_max = map(float, region)
    span = lon_max - lon_min
    west = float(wrap_longitude(lon_min))
    return lat_min, lat_max, west, west + (span if 0.0 <= span <= 360.0 else span % 360.0)


def date_line_order(lon: np.ndarray) -> np.ndarray | None:
    """``[W]`` column order that makes longitudes ``lon`` (ascending in [-180, 180)) one run eastward when they are
    a box across the date line: regular steps but one gap inside, and contiguous across 180 degrees (what
    ``gridtnp data prepare --region`` writes for ``LON_MIN > LON_MAX``); None for any other axis."""
    west = _date_line_west(np.asarray(lon, np.float64))
    return None if west is None else np.r_[west : len(lon), 0:west]


def _date_line_west(lon: np.ndarray) -> int | None:
    """Index of the western edge of a box across the date line (the first point after its one gap), or None."""
    if lon.size < 3:
        return None
    steps = np.diff(lon)
    step = float(np.median(steps))
    gaps = np.flatnonzero(steps > 1.5 * step)
    if len(gaps) != 1 or not np.isclose(lon[0] + 360.0 - lon[-1], step, rtol=1e-3):
        return None
    return int(gaps[0]) + 1


def continuous_longitudes(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with the longitudes of a box across the date line (``date_line_order``) in one run, those east of 180
    degrees raised by 360 (a box from 140 E to 160 W reads 140 to 200), lazily; any other ``ds`` as it is. The
    station and multi-source tasks, and the models' grids, then see one regular axis."""
    west = _date_line_west(ds["longitude"].values.astype(np.float64))
    return ds if west is None else _eastward_from(ds, west)


def time_chunk(var: xr.DataArray) -> int:
    """Time steps per stored chunk of ``var`` (opened by ``open_store``, chunked or not)."""
    if var.chunks is not None:
        return int(var.chunks[0][0])
    chunks = var.encoding.get("preferred_chunks", {})
    if "time" not in chunks:
        raise DataError(f"variable {var.name!r}: its stored chunking is unknown; open it with open_store.")
    return int(chunks["time"])


def check_layout(ds: xr.Dataset, source: str = "dataset") -> None:
    """Raise ``DataError`` unless ``ds`` is in the prepared layout (see the module docstring)."""
    missing = [d for d in DIMS if d not in ds.coords]
    if missing:
        raise DataError(
            f"{source}: no {', '.join(missing)} coordinate (found: {', '.join(map(str, ds.coords)) or 'none'}); "
            f"gridtnp expects coordinates named {', '.join(DIMS)}. {_PREPARE_HINT}"
        )
    if not np.issubdtype(ds["time"].dtype, np.datetime64):
        raise DataError(f"{source}: time has dtype {ds['time'].dtype}, expected datetime64. {_PREPARE_HINT}")
    lat = ds["latitude"].values
    lon = ds["longitude"].values
    if lat.size > 1 and not np.all(np.diff(lat) > 0):
        order = "descending" if np.all(np.diff(lat) < 0) else "not sorted"
        raise DataError(f"{source}: latitudes are {order} ({lat[0]} to {lat[-1]}); expected ascending. {_PREPARE_HINT}")
    if lon.size and (lon.min() < -180 or lon.max() >= 180):
        raise DataError(
            f"{source}: longitudes span {lon.min()} to {lon.max()}; expected [-180, 180) "
            f"(a 0-360 store must be converted). {_PREPARE_HINT}"
        )
    if lon.size > 1 and not np.all(np.diff(lon) > 0):
        raise DataError(f"{source}: longitudes are not ascending; expected ascending in [-180, 180). {_PREPARE_HINT}")
    for name, var in ds.data_vars.items():
        absent = [d for d in DIMS if d not in var.dims]
        if absent:
            raise DataError(f"{source}: variable {name!r} has dims {var.dims}; expected it to include {DIMS}.")


def select(
    ds: xr.Dataset,
    start: DateLike | None = None,
    end: DateLike | None = None,
    region: tuple[float, float, float, float] | None = None,
) -> xr.Dataset:
    """Lazy subset of a prepared ``ds``: times in [start, end] and ``region=(lat_min, lat_max, lon_min, lon_max)``.

    Bounds are inclusive; a date ``"2019-03-21"`` as ``end`` includes that whole day. A range or region reaching
    outside the store is an error naming the store's coverage (no silent clipping).
    """
    out = select_time(ds, start, end)
    if region is None:
        return out
    lat_min, lat_max, lon_min, lon_max = map(float, region)
    if lat_min > lat_max or lon_min > lon_max:
        raise DataError(
            f"Region {tuple(region)} must be (lat_min, lat_max, lon_min, lon_max) with min <= max, in the store's "
            f"longitudes ({coverage(ds)}). A box across the date line is one run past 180 degrees (140 to 200 for "
            "140 E to 160 W): open a global store with open_store(..., west=lon_min) and select that, as the "
            "DataModules do with region=(lat_min, lat_max, lon_min, lon_max) and lon_min > lon_max."
        )
    lat, lon = ds["latitude"].values, ds["longitude"].values
    if lat_min < lat.min() or lat_max > lat.max() or lon_min < lon.min() or lon_max > lon.max():
        raise DataError(
            f"Region lat {lat_min:g} to {lat_max:g}, lon {lon_min:g} to {lon_max:g} reaches outside the store, "
            f"which covers {coverage(ds)}."
        )
    out = out.sel(latitude=slice(lat_min, lat_max), longitude=slice(lon_min, lon_max))
    if out.sizes["latitude"] == 0 or out.sizes["longitude"] == 0:
        raise DataError(
            f"Region lat {lat_min:g} to {lat_max:g}, lon {lon_min:g} to {lon_max:g} contains no grid point "
            f"(grid steps {_step(lat):g} x {_step(lon):g} degrees)."
        )
    return out


def normalisation_stats(
    ds: xr.Dataset,
    variable: str,
    level: float | None = None,
    source: str = "store",
    given: dict[str, Sequence[float]] | None = None,
) -> tuple[float, float]:
    """``(mean, std)`` of ``variable`` (at ``level``, when the store has per-level statistics) over the training
    period, as written by ``gridtnp data prepare``; ``given`` (``{"t2m": [mean, std], "u@850": [...]}``) takes
    precedence, for stores without them."""
    stats = ds.attrs.get(STATS_ATTR, {})
    keys = [variable] if level is None else [f"{variable}@{level:g}", variable]
    chosen = next((given[k] for k in keys if given and k in given), None)
    if chosen is not None:
        if len(chosen) != 2:
            raise ConfigError(f"stats for {keys[0]!r} must be [mean, std]; got {chosen!r}.")
        mean, std = (float(v) for v in chosen)
    elif variable in stats:
        entry = stats[variable]
        if level is not None and f"{level:g}" in entry.get("levels", {}):
            entry = entry["levels"][f"{level:g}"]
        mean, std = float(entry["mean"]), float(entry["std"])
    else:
        raise DataError(
            f"{source}: no normalisation statistics for {keys[0]!r} in the store's attrs[{STATS_ATTR!r}] "
            f"(have: {', '.join(stats) or 'none'}); pass them as stats: {{{keys[0]}: [mean, std]}}. {_PREPARE_HINT}"
        )
    if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
        raise DataError(f"{source}: {variable!r} has statistics mean {mean}, std {std}; need a finite std > 0.")
    return mean, std


def region_index(ds: xr.Dataset, box: xr.Dataset) -> dict[str, slice]:
    """Index slices ``{"latitude": slice, "longitude": slice}`` of ``ds`` that hold ``box`` (a ``select`` of it)."""
    out = {}
    for dim in ("latitude", "longitude"):
        first = int(np.searchsorted(ds[dim].values, box[dim].values[0]))
        out[dim] = slice(first, first + box.sizes[dim])
    return out


def _step(axis: np.ndarray) -> float:
    return float(np.median(np.diff(axis))) if axis.size > 1 else float("nan")


def coarsen_fields(fields: np.ndarray, factor: int) -> np.ndarray:
    """NaN-aware mean over ``factor x factor`` blocks: ``[..., H, W] -> [..., ceil(H / f), ceil(W / f)]``.

    Edge blocks average the points they have; a block with no finite value is NaN. Block sums by ``reduceat``
    along each axis (no padded copy); the NaN bookkeeping only runs when there are NaNs.
    """
    if factor <= 1:
        return fields
    h, w = fields.shape[-2:]
    rows, cols = np.arange(0, h, factor), np.arange(0, w, factor)

    def block_sums(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.add.reduceat(values, cols, axis=-1), rows, axis=-2)

    finite = np.isfinite(fields)
    if finite.all():
        count = np.outer(np.diff(np.append(rows, h)), np.diff(np.append(cols, w)))  # points per block [h', w']
        return (block_sums(fields) / count).astype(np.float32)
    total = block_sums(np.where(finite, fields, 0.0))
    count = block_sums(finite.astype(np.float32))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan).astype(np.float32)
