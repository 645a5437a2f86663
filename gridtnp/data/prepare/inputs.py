"""Opening ``gridtnp data prepare``'s inputs: local NetCDF / GRIB / Zarr files and Zarr stores at a URL.

* ``open_sources(paths, variables, time_chunk, selection)``: the inputs (cut by a ``Selection``: dates, region,
  levels, archive names) normalised and checked (``gridtnp.data.prepare.input_checks``) and combined into one lazy
  dataset;
  ``open_source(path)``: one input as stored; ``open_remote_zarr(url)``: a Zarr store through fsspec.
* ``auto_time_chunk(ds)``: the default time steps per chunk; ``space_chunks``: the spatial chunking of a regional
  store; ``netcdf_chunk_cache``: netCDF's per-variable chunk cache bounded while the inputs are open.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp.data.archive import (
    NAMES,
    VALID_STOP,
    Pick,
    level_indices,
    raw_variables,
    resolve,
    select_part,
    valid_dates,
)
from gridtnp.data.layout import COORD_ALIASES, DIMS, DataError, date_bounds, iso
from gridtnp.data.prepare.input_checks import check_longitudes, check_units, normalise_checked
from gridtnp.files import is_url

GRIB_SUFFIXES = (".grib", ".grb", ".grib2", ".grb2")
NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5")


def open_source(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """One NetCDF (``.nc``), GRIB (``.grib``, needs cfgrib) or Zarr (``.zarr``, local or a URL read through fsspec,
    e.g. ARCO-ERA5 on ``gs://``) input, lazily, as stored."""
    name = str(path)
    if is_url(name):
        if Path(name.split("?", 1)[0]).suffix.lower() in NETCDF_SUFFIXES:
            return open_remote_netcdf(name, storage_options)
        return open_remote_zarr(name, storage_options)
    if not os.path.exists(name):
        raise DataError(f"{name}: no such file.")
    suffix = Path(name.rstrip("/")).suffix.lower()
    kwargs: dict[str, Any] = {}  # lazy backend arrays; open_sources chunks them one step per block
    if suffix == ".zarr":
        kwargs["engine"] = "zarr"
    elif suffix in GRIB_SUFFIXES:
        if importlib.util.find_spec("cfgrib") is None:
            raise DataError(f"{name}: reading GRIB needs cfgrib and ecCodes: pip install cfgrib eccodes")
        kwargs.update(engine="cfgrib", decode_timedelta=False, backend_kwargs={"indexpath": ""})
    try:
        return xr.open_dataset(name, **kwargs)
    except Exception as err:
        raise DataError(
            f"{name}: cannot be read ({type(err).__name__}: {first_line(err)}). Expected a NetCDF-3/4 file (.nc), "
            "a GRIB file (.grib, needs cfgrib) or a Zarr store (.zarr); the file may be truncated or corrupt."
        ) from err


def open_sources(
    paths: Sequence[str | os.PathLike[str]],
    variables: Sequence[str] | None = None,
    time_chunk: int | None = 24,
    selection: Selection | None = None,
) -> xr.Dataset:
    """Open, normalise and combine ``paths`` (one dataset split by time and/or by variable) into one lazy dataset,
    dask-chunked ``time_chunk`` steps (None: ``auto_time_chunk``) x full grid so each task reads only its slice of a
    source file.

    ``selection`` (dates, region, levels, storage options) cuts each input before it is combined; with it,
    ``variables`` may use archive or short names (``gridtnp.data.archive``) and inputs without a step in the
    dates are skipped."""
    if not paths:
        raise DataError("No input files given; expected one or more NetCDF / GRIB files.")
    names = ", ".join(map(str, paths))
    opened: list[xr.Dataset] = []
    try:
        parts, kept, stops = [], [], []
        for path in paths:
            opened.append(open_source(path, selection.storage_options if selection else None))
            if selection is None:
                part = normalise_checked(_step_chunks(opened[-1]), str(path))
            else:
                part = selection.cut(opened[-1], variables, str(path))
                if part.sizes["time"] == 0:
                    if VALID_STOP in opened[-1].attrs:
                        stops.append(f"{path} holds final data to {opened[-1].attrs[VALID_STOP]} (valid_time_stop)")
                    continue
            steps = time_chunk or auto_time_chunk(part)  # read as it will be written: no larger chunk in memory
            parts.append(part.chunk({dim: (steps if dim == "time" else -1) for dim in part.dims}))
            kept.append(path)
        if not parts:
            window = (
                f"after the store's last step ({iso(selection.after)})"
                if selection.after is not None
                else f"between --start {selection.start} and --end {selection.end}"
            )
            if stops and selection.after is not None:
                raise DataError(
                    f"{'; '.join(stops)}: no step of final data after the store's last step "
                    f"({iso(selection.after)}); its later steps are the archive's empty padding. Append once the "
                    "archive's final data goes further (or pass --end within valid_time_stop_era5t for ERA5T)."
                )
            raise DataError(f"{names}: no time step {window}.")
        check_units(parts, kept)
        ds = parts[0] if len(parts) == 1 else _combine(parts, kept)
        if selection is not None and variables is not None:
            variables = list(ds.data_vars)  # the names written (short names, u850 for one level)
        ds = ds[_pick_variables(ds, variables, names)]
    except BaseException:
        _close_all(opened)
        raise
    ds.set_close(lambda: _close_all(opened))
    return ds


@dataclass
class Selection:
    """What ``gridtnp data prepare`` keeps of each input: dates ``[start, end]``, a ``region`` (lat_min, lat_max,
    lon_min, lon_max; across the date line when lon_min > lon_max), ``levels`` of level variables, the fsspec
    ``storage_options`` of URL inputs, and for ``--append`` only the steps ``after`` a time (the store's last)."""

    start: str | None = None
    end: str | None = None
    region: tuple[float, float, float, float] | None = None
    levels: Sequence[float] | None = None
    storage_options: dict[str, Any] | None = None
    after: np.datetime64 | None = None

    def cut(self, raw: xr.Dataset, variables: Sequence[str] | None, where: str) -> xr.Dataset:
        """One raw input as opened: the requested variables (archive or short names) and dates, chunked, normalised,
        then cut to the region and levels, lazily."""
        start, end = valid_dates(raw.attrs, self.start, self.end, where)
        whole = self.region is None  # with a region, the longitudes are checked as cut (it may cross the date line)
        # Variables, levels and dates first, on the lazy backend arrays: chunked whole, an archive's 1.3 M hourly
        # steps of dozens of variables would be a task graph of minutes and gigabytes, and every step of 37 levels
        # (ARCO-ERA5 chunks a level variable's hour whole) would stay in memory for its one level read.
        if variables is None:  # every variable on time, latitude and longitude, under its short name
            part = normalise_checked(_step_chunks(_dates(raw, start, end, self.after)), where, whole)
            gridded = [str(v) for v, da in part.data_vars.items() if set(DIMS) <= set(da.dims)]
            picks = [Pick(v, None, NAMES.get(v, v)) for v in gridded]
            part = part[gridded]
        else:
            picks = resolve(raw, variables, where)
            raw = raw[raw_variables(picks)].isel(level_indices(raw, picks, self.levels))
            part = normalise_checked(_step_chunks(_dates(raw, start, end, self.after)), where, whole)
        if self.after is not None:  # time is ascending once normalised: the steps after it are a tail (a slice)
            part = part.isel(time=slice(int(part.indexes["time"].searchsorted(self.after, side="right")), None))
        part = select_part(part, picks, self.levels, start, end, self.region)
        if self.region is not None and self.region[2] <= self.region[3]:
            check_longitudes(part["longitude"].values.astype(np.float64), where)
        return part


def _dates(raw: xr.Dataset, start: str | None, end: str | None, after: np.datetime64 | None = None) -> xr.Dataset:
    """``raw``'s steps in ``[start, end]`` (inclusive dates) and after ``after``, where its time axis is ascending
    datetimes; else all of it (normalising sorts and checks the axis, and the caller cuts it then)."""
    if start is None and end is None and after is None:
        return raw
    name = next((str(d) for d in raw.dims if str(d).lower() in COORD_ALIASES["time"]), None)
    index = raw.indexes.get(name) if name is not None else None
    if not isinstance(index, pd.DatetimeIndex) or not index.is_monotonic_increasing:
        return raw
    first = index.searchsorted(date_bounds(start, "--start")[0]) if start is not None else 0
    if after is not None:
        first = max(first, index.searchsorted(after, side="right"))
    stop = index.searchsorted(date_bounds(end, "--end")[1], side="right") if end is not None else len(index)
    return raw.isel({name: slice(int(first), int(stop))})


def _step_chunks(raw: xr.Dataset) -> xr.Dataset:
    """``raw`` as dask arrays of the steps of one stored chunk in time (any spelling of time; one step where the
    input is not chunked) by the whole of every other dimension, so that normalising (a latitude flip, a
    longitude rotation) and cutting relabel blocks and each stored chunk is decompressed once."""
    steps = {}
    for dim in raw.dims:
        if str(dim).lower() in COORD_ALIASES["time"]:
            stored = [v.encoding.get("preferred_chunks", {}).get(dim, 1) for v in raw.data_vars.values()]
            steps[dim] = max(stored, default=1)
        else:
            steps[dim] = -1
    return raw.chunk(steps)


def open_remote_netcdf(url: str, storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """A NetCDF-4 file at a URL (``https://``, ``gs://``, ``s3://``) through fsspec and h5netcdf, lazily: only the
    byte ranges of the chunks read are fetched."""
    try:
        import fsspec
        import h5netcdf  # noqa: F401  (xarray's engine for file objects)
        import h5py  # noqa: F401  (h5netcdf's backend, an extra of it)
    except ImportError as err:
        raise DataError(
            f"{url}: reading NetCDF at a URL needs fsspec, h5netcdf and h5py: pip install gridtnp[cloud]."
        ) from err
    try:
        handle = fsspec.open(url, mode="rb", **(storage_options or {})).open()
        return xr.open_dataset(handle, engine="h5netcdf")
    except ImportError as err:
        protocol = url.split("://", 1)[0]
        raise DataError(
            f"{url}: reading it needs fsspec's {protocol} backend ({err}): pip install gridtnp[cloud]."
        ) from err
    except Exception as err:
        raise DataError(
            f"{url}: cannot be read as NetCDF-4 ({type(err).__name__}: {first_line(err)}). At a URL, prepare reads "
            "NetCDF-4 (HDF5) files and Zarr stores; NetCDF-3 files must be downloaded first."
        ) from err


def open_remote_zarr(url: str, storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """A Zarr store at a URL (``gs://``, ``s3://``, ``https://``) through fsspec, lazily, with its own chunks."""
    try:
        return xr.open_zarr(url, storage_options=storage_options, chunks=None)
    except ImportError as err:
        protocol = url.split("://", 1)[0]
        hint = "pip install gridtnp[cloud]" if protocol in ("gs", "gcs") else f"install fsspec's {protocol} backend"
        raise DataError(f"{url}: reading it needs a package that is missing ({err}); {hint}.") from err
    except Exception as err:
        raise DataError(
            f"{url}: cannot be opened as a Zarr store ({type(err).__name__}: {first_line(err)}). Prepare reads "
            "local NetCDF / GRIB / Zarr inputs, and Zarr stores and NetCDF-4 files (.nc) at a URL."
        ) from err


def _combine(parts: list[xr.Dataset], paths: Sequence[Any]) -> xr.Dataset:
    """Concatenate in time the parts holding the same variables, then merge the variable groups; same grid, no
    overlapping times (checked here: ``combine_by_coords`` would silently intersect mismatched grids)."""
    for part, path in zip(parts[1:], paths[1:], strict=True):
        for dim in ("latitude", "longitude"):
            if not np.array_equal(part[dim].values, parts[0][dim].values):
                raise DataError(
                    f"{path}: its {dim} axis ({axis_summary(part[dim].values)}) differs from {paths[0]}'s "
                    f"({axis_summary(parts[0][dim].values)}); expected every input on the same grid."
                )
    groups: dict[tuple[str, ...], list[tuple[xr.Dataset, Any]]] = {}
    for part, path in zip(parts, paths, strict=True):
        groups.setdefault(tuple(sorted(map(str, part.data_vars))), []).append((part, path))
    merged = []
    for members in groups.values():
        members.sort(key=lambda member: member[0]["time"].values[0])
        for (prev, prev_path), (part, path) in itertools.pairwise(members):
            if part["time"].values[0] <= prev["time"].values[-1]:
                raise DataError(
                    f"{path} starts at {iso(part.time.values[0])}, before {prev_path} ends at "
                    f"{iso(prev.time.values[-1])}; expected inputs that split the data in time, no step repeated."
                )
        datasets = [m[0] for m in members]
        merged.append(
            datasets[0] if len(datasets) == 1 else xr.concat(datasets, "time", combine_attrs="drop_conflicts")
        )
    try:
        return xr.merge(merged, join="exact", combine_attrs="drop_conflicts")
    except ValueError as err:
        raise DataError(
            f"Inputs {', '.join(map(str, paths))} cannot be merged ({first_line(err)}); files holding different "
            "variables must cover the same times."
        ) from err


def axis_summary(values: np.ndarray) -> str:
    """``721 values, -90 to 90``: an axis in a message."""
    return f"{len(values)} values, {values[0]:g} to {values[-1]:g}" if len(values) else "empty"


def _pick_variables(ds: xr.Dataset, variables: Sequence[str] | None, names: str) -> list[str]:
    """The requested variables (default: every variable on time, latitude and longitude), checked."""
    gridded = [str(v) for v, da in ds.data_vars.items() if set(DIMS) <= set(da.dims)]
    if variables is None:
        if not gridded:
            raise DataError(f"{names}: no variable with dims {DIMS} (found {describe_vars(ds)}).")
        return gridded
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        raise DataError(
            f"{names}: no variable {', '.join(map(repr, missing))}; available: {describe_vars(ds)}. "
            "Pass --variables with names from that list."
        )
    wrong = [v for v in variables if v not in gridded]
    if wrong:
        raise DataError(f"{names}: variable {wrong[0]!r} has dims {ds[wrong[0]].dims}; expected it to include {DIMS}.")
    return list(variables)


def _close_all(datasets: Sequence[xr.Dataset]) -> None:
    for ds in datasets:
        ds.close()


MAX_TIME_CHUNK = 24


TARGET_CHUNK_BYTES = 4 * 2**20


def auto_time_chunk(ds: xr.Dataset, space: dict[str, int] | None = None) -> int:
    """Time steps per chunk: as many as keep the largest variable's float32 chunk under 4 MiB, 1 to 24.

    A task reads whole chunks, so for random access in time a chunk should be about what one task needs: one
    step of a global 0.25 degree field (4.0 MiB), a day of a regional box. ``space``: points per chunk along
    latitude / longitude, when the store is chunked in space too.
    """
    space = space or {}
    per_step = max(
        (
            4 * int(np.prod([space.get(str(d), ds.sizes[d]) for d in v.dims if d != "time"]))
            for v in ds.data_vars.values()
        ),
        default=4,
    )
    return int(min(MAX_TIME_CHUNK, max(1, TARGET_CHUNK_BYTES // per_step)))


def space_chunks(ds: xr.Dataset, points: int | None) -> dict[str, int]:
    """``{"latitude": n, "longitude": n}`` points per chunk (the whole axis when None or larger)."""
    if points is None:
        return {}
    if points < 1:
        raise DataError(f"--space-chunk {points}: expected a positive number of grid points per chunk.")
    return {dim: min(points, ds.sizes[dim]) for dim in ("latitude", "longitude")}


NETCDF_CHUNK_CACHE = 4 * 2**20  # bytes per variable: netCDF's default (64 MiB) in every open file adds up


@contextlib.contextmanager
def netcdf_chunk_cache(nbytes: int) -> Iterator[None]:
    """netCDF's per-variable chunk cache of the files opened inside, ``nbytes`` (restored after): with the default,
    memory grows by tens of MB per open input file."""
    try:
        import netCDF4
    except ImportError:
        yield
        return
    before = netCDF4.get_chunk_cache()
    netCDF4.set_chunk_cache(nbytes, before[1], before[2])
    try:
        yield
    finally:
        netCDF4.set_chunk_cache(*before)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def describe_vars(ds: xr.Dataset) -> str:
    return ", ".join(f"{v} {tuple(map(str, da.dims))}" for v, da in ds.data_vars.items()) or "(none)"
