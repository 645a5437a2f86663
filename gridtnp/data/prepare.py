"""``gridtnp data prepare``: NetCDF / GRIB / Zarr inputs -> one Zarr store in gridtnp's layout, with statistics.

gridtnp data prepare era5_2019-03.nc --out era5.zarr --train-start 2019-03-01 --train-end 2019-03-21

The store holds float32 variables ``[time, ..., latitude, longitude]`` chunked ``time_chunk x full grid`` (one read
per sampled time step; ``--space-chunk`` splits the grid too), latitudes ascending, longitudes ascending in
[-180, 180), ``time`` as datetime64, CF attributes kept; ``attrs["gridtnp_stats"]`` has each variable's mean and std
over the training period (``train_start``/``train_end``, the whole input when unset: the DataModules then refuse
validation or test dates inside it) and ``attrs["gridtnp_provenance"]`` the sources and the command. Inputs are
local NetCDF / GRIB / Zarr files or Zarr stores at a URL (e.g. ARCO-ERA5), with variables by archive or short name
(``gridtnp.data.archive``), cut to dates, a region and levels first. The data is written block by block into
``.<name>.partial`` beside the target (``gridtnp.data.writer``: bounded memory, a checkpoint to resume a killed run),
then renamed into place: an interrupted run leaves the old store or none under the target's name, never a
half-written one (a crash between the two renames of ``--overwrite`` leaves the old store aside as
``.<name>.old-*``). The rename is atomic, the store's files are not fsynced (xarray's Zarr writer does not).
``--append`` extends a store with later steps (``gridtnp.data.append``).

* ``prepare(inputs, out, variables, train_start, train_end, time_chunk, ...)``: write the store, return its path.
* ``open_sources(paths, variables, time_chunk, selection)``: the inputs (cut by a ``Selection``) normalised
  (``gridtnp.data.layout.normalise``) and combined into one lazy dataset; ``open_source(path)``: one input as stored.
* ``auto_time_chunk(ds)``: the default time steps per chunk; ``is_zarr_store(path)``; ``data_main(argv)``: the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.archive import NAMES, Pick, parse_region, raw_variables, resolve, select_part
from gridtnp.data.climatology import CLIMATOLOGY_ATTR, write_climatology
from gridtnp.data.input_checks import check_units, check_writable, normalise_checked
from gridtnp.data.inventory import CHUNKS_ATTR, inventory
from gridtnp.data.layout import (
    DIMS,
    PROVENANCE_ATTR,
    STATS_ATTR,
    DataError,
    coverage,
    iso,
    select_time,
)
from gridtnp.data.writer import clear_state, state_matches, write_blocks
from gridtnp.files import is_url, remove_path, replace_path

GRIB_SUFFIXES = (".grib", ".grb", ".grib2", ".grb2")
ZARR_FORMAT = 2  # readable by zarr-python 2 and 3 (and most other Zarr readers); v3 adds nothing needed here


def open_source(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """One NetCDF (``.nc``), GRIB (``.grib``, needs cfgrib) or Zarr (``.zarr``, local or a URL read through fsspec,
    e.g. ARCO-ERA5 on ``gs://``) input, lazily, as stored."""
    name = str(path)
    if is_url(name):
        return open_remote_zarr(name, storage_options)
    if not os.path.exists(name):
        raise DataError(f"{name}: no such file.")
    suffix = Path(name.rstrip("/")).suffix.lower()
    kwargs: dict[str, Any] = {}  # no dask yet: lazy backend arrays, chunked after normalising (open_sources)
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
            f"{name}: cannot be read ({type(err).__name__}: {_first_line(err)}). Expected a NetCDF-3/4 file (.nc), "
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
        parts, kept = [], []
        for path in paths:
            opened.append(open_source(path, selection.storage_options if selection else None))
            if selection is None:
                part = normalise_checked(opened[-1], str(path))
            else:
                part = selection.cut(opened[-1], variables, str(path))
                if part.sizes["time"] == 0:
                    continue
            steps = time_chunk or auto_time_chunk(part)  # read as it will be written: no larger chunk in memory
            parts.append(part.chunk({dim: (steps if dim == "time" else -1) for dim in part.dims}))
            kept.append(path)
        if not parts:
            raise DataError(f"{names}: no time step between --start {selection.start} and --end {selection.end}.")
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
    lon_min, lon_max; across the date line when lon_min > lon_max), ``levels`` of level variables, and the fsspec
    ``storage_options`` of URL inputs."""

    start: str | None = None
    end: str | None = None
    region: tuple[float, float, float, float] | None = None
    levels: Sequence[float] | None = None
    storage_options: dict[str, Any] | None = None

    def cut(self, raw: xr.Dataset, variables: Sequence[str] | None, where: str) -> xr.Dataset:
        """One raw input: the requested variables (archive or short names), normalised, then cut, lazily."""
        if variables is None:  # every variable on time, latitude and longitude, under its short name
            part = normalise_checked(raw, where)
            gridded = [str(v) for v, da in part.data_vars.items() if set(DIMS) <= set(da.dims)]
            picks = [Pick(v, None, NAMES.get(v, v)) for v in gridded]
            part = part[gridded]
        else:
            picks = resolve(raw, variables, where)
            part = normalise_checked(raw[raw_variables(picks)], where)
        return select_part(part, picks, self.levels, self.start, self.end, self.region)


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
            f"{url}: cannot be opened as a Zarr store ({type(err).__name__}: {_first_line(err)}). Prepare reads "
            "local NetCDF / GRIB / Zarr inputs and Zarr stores at a URL."
        ) from err


def _combine(parts: list[xr.Dataset], paths: Sequence[Any]) -> xr.Dataset:
    """Concatenate in time the parts holding the same variables, then merge the variable groups; same grid, no
    overlapping times (checked here: ``combine_by_coords`` would silently intersect mismatched grids)."""
    for part, path in zip(parts[1:], paths[1:], strict=True):
        for dim in ("latitude", "longitude"):
            if not np.array_equal(part[dim].values, parts[0][dim].values):
                raise DataError(
                    f"{path}: its {dim} axis ({_axis_summary(part[dim].values)}) differs from {paths[0]}'s "
                    f"({_axis_summary(parts[0][dim].values)}); expected every input on the same grid."
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
            f"Inputs {', '.join(map(str, paths))} cannot be merged ({_first_line(err)}); files holding different "
            "variables must cover the same times."
        ) from err


def _axis_summary(values: np.ndarray) -> str:
    return f"{len(values)} values, {values[0]:g} to {values[-1]:g}" if len(values) else "empty"


def _pick_variables(ds: xr.Dataset, variables: Sequence[str] | None, names: str) -> list[str]:
    """The requested variables (default: every variable on time, latitude and longitude), checked."""
    gridded = [str(v) for v, da in ds.data_vars.items() if set(DIMS) <= set(da.dims)]
    if variables is None:
        if not gridded:
            raise DataError(f"{names}: no variable with dims {DIMS} (found {_describe_vars(ds)}).")
        return gridded
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        raise DataError(
            f"{names}: no variable {', '.join(map(repr, missing))}; available: {_describe_vars(ds)}. "
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


def _space_chunks(ds: xr.Dataset, points: int | None) -> dict[str, int]:
    """``{"latitude": n, "longitude": n}`` points per chunk (the whole axis when None or larger)."""
    if points is None:
        return {}
    if points < 1:
        raise DataError(f"--space-chunk {points}: expected a positive number of grid points per chunk.")
    return {dim: min(points, ds.sizes[dim]) for dim in ("latitude", "longitude")}


def prepare(
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    variables: Sequence[str] | None = None,
    train_start: str | None = None,
    train_end: str | None = None,
    time_chunk: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    climatology: bool = False,
    start: str | None = None,
    end: str | None = None,
    region: str | Sequence[float] | None = None,
    levels: Sequence[float] | None = None,
    storage_options: dict[str, Any] | None = None,
    jobs: int | None = None,
    block_steps: int | None = None,
    checkpoint_s: float = 30.0,
    scheduler: str | None = None,
    coarsen: int = 1,
    space_chunk: int | None = None,
) -> Path:
    """Write ``inputs`` as a prepared Zarr store at ``out`` (see the module docstring) and return its path.

    ``time_chunk`` steps per chunk; None picks the most steps (at most 24) whose chunk of the largest variable
    stays under 4 MiB: 24 for a regional box, 1 for a global 0.25 degree grid (721 x 1,440: 4.0 MiB a step).
    ``climatology``: also store each variable's mean per grid point and UTC hour of day over the training period
    (``gridtnp.data.climatology``), in the same pass over the inputs. ``start``/``end`` (inclusive dates),
    ``region`` (``lat_min, lat_max, lon_min, lon_max``; across the date line when ``lon_min > lon_max``) and
    ``levels`` cut the inputs first; ``variables`` may then use archive or short names (``gridtnp.data.archive``);
    ``storage_options``: fsspec options of URL inputs (``{"token": "anon"}`` for public buckets). The data is
    written in blocks of ``block_steps`` time steps (default about 128 MiB), read with ``jobs`` threads (or on the
    cluster of an active ``dask.distributed`` client); a checkpoint every ``checkpoint_s`` seconds lets a rerun of a
    killed prepare resume (``gridtnp.data.writer``). ``scheduler``: the address of a ``dask.distributed``
    scheduler (``tcp://host:8786``) whose workers do the reading (they must see the inputs); the store is the one a
    local run writes. ``coarsen``: average ``coarsen x coarsen`` blocks of grid points first (NaN-aware; a partial
    block at the end of an axis is dropped). ``space_chunk``: grid points per chunk along latitude and longitude
    (default: the whole grid), so that a task on a region reads only the chunks over it.
    """
    log = print if progress else _silent
    out_path = Path(out)
    if is_url(out):
        raise DataError(f"--out {out}: prepare writes a local store; copy it to remote storage afterwards.")
    if time_chunk is not None and time_chunk < 1:
        raise DataError(f"--time-chunk {time_chunk}: expected a positive number of time steps per chunk.")
    _check_target(out_path, overwrite)
    check_writable(out_path, "--out")

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    box = parse_region(region) if region is not None else None
    selection = Selection(start, end, box, list(levels) if levels is not None else None, storage_options)
    log(f"gridtnp data prepare: [1/4] opening {len(inputs)} input file(s)")
    with _netcdf_chunk_cache(NETCDF_CHUNK_CACHE), _cluster(scheduler, log):
        source = open_sources(inputs, variables, time_chunk, selection)
        try:
            ds = _to_float32(source)
            if coarsen > 1:  # NaN-aware block means; coordinates the blocks' centres; a partial edge block dropped
                ds = ds.coarsen(latitude=coarsen, longitude=coarsen, boundary="trim").mean(keep_attrs=True)
            space = _space_chunks(ds, space_chunk)
            steps = min(time_chunk or auto_time_chunk(ds, space), ds.sizes["time"])
            ds = ds.chunk({dim: steps if dim == "time" else space.get(str(dim), -1) for dim in ds.dims})
            encoding = {
                v: {
                    "chunks": tuple(steps if d == "time" else space.get(str(d), ds.sizes[d]) for d in ds[v].dims),
                    "dtype": "float32",
                }
                for v in ds.data_vars
            }
            train = select_time(ds, train_start, train_end)
            time_index = ds.indexes["time"]
            train_span = (int(time_index.get_loc(train.indexes["time"][0])), 0)
            train_span = (train_span[0], train_span[0] + train.sizes["time"])

            shape = " x ".join(f"{ds.sizes[d]} {d}" for d in ds.dims)
            log(f"gridtnp data prepare: [2/4] {', '.join(ds.data_vars)} on {shape}; {coverage(ds)}")
            log(
                f"gridtnp data prepare: [3/4] writing {out_path} in chunks of {steps} time steps, with mean/std over "
                f"{iso(train.time.values[0])} to {iso(train.time.values[-1])} ({train.sizes['time']} steps)"
            )
            remove_leftovers(out_path)
            partial = partial_path(out_path)
            fingerprint = _fingerprint(inputs, ds, steps, train_span, climatology, block_steps)
            if not (partial.is_dir() and state_matches(partial, fingerprint)):
                remove_path(partial)
                store_kwargs = {"zarr_format": ZARR_FORMAT} if _zarr_major() >= 3 else {}
                ds.to_zarr(partial, mode="w-", encoding=encoding, consolidated=False, compute=False, **store_kwargs)
            try:
                stats, clim = write_blocks(
                    ds, partial, train_span, fingerprint, steps, climatology, jobs, checkpoint_s, log, block=block_steps
                )
            except DataError:
                raise
            except Exception as err:
                raise DataError(
                    f"Reading {', '.join(map(str, inputs))} failed while writing ({type(err).__name__}: {err}); "
                    "is an input file truncated or corrupt? (Rerun the same command to resume.)"
                ) from err
            stats_attr = _stats_attr(stats, train, inputs)
            extra = {CLIMATOLOGY_ATTR: write_climatology(partial, clim, train)} if clim is not None else {}
            provenance = _provenance(inputs, out_path, variables, train_start, train_end, steps, climatology)
            provenance["command"] += _selection_args(start, end, region, levels)
            clear_state(partial)
            _finish_store(partial, stats_attr, provenance, extra)
            log(f"gridtnp data prepare: [4/4] moving the new store into place at {out_path}")
            replace_path(partial, out_path)
        finally:
            source.close()
    for v, s in stats_attr.items():
        log(f"gridtnp data prepare: {v}: mean {s['mean']:.6g}, std {s['std']:.6g} {ds[v].attrs.get('units', '')}")
    log(f"gridtnp data prepare: done, {_size_mb(out_path):.1f} MB at {out_path}")
    return out_path


NETCDF_CHUNK_CACHE = 4 * 2**20  # bytes per variable: netCDF's default (64 MiB) in every open file adds up


@contextlib.contextmanager
def _netcdf_chunk_cache(nbytes: int) -> Iterator[None]:
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


@contextlib.contextmanager
def _cluster(address: str | None, log: Any) -> Iterator[None]:
    """Inside, dask computes on the ``dask.distributed`` cluster at ``address`` (nothing changes for None)."""
    if address is None:
        yield
        return
    try:
        from distributed import Client
    except ImportError as err:
        raise DataError("--scheduler needs dask.distributed: pip install gridtnp[distributed]") from err
    with Client(address) as client:
        workers = len(client.scheduler_info()["workers"])
        log(f"gridtnp data prepare: reading on the cluster at {address} ({workers} workers)")
        yield


def partial_path(out: Path) -> Path:
    """Where a prepare into ``out`` writes until it finishes (kept after a kill, to resume)."""
    return out.with_name(f".{out.name}.partial")


def _fingerprint(
    inputs: Sequence[Any],
    ds: xr.Dataset,
    steps: int,
    train: tuple[int, int],
    climatology: bool,
    block: int | None,
) -> dict[str, Any]:
    """What a resumed prepare must share with the killed one: inputs (local: size and modification time), the
    variables and their shapes, the time axis, the chunking, the training span and the climatology."""
    sources = []
    for p in inputs:
        name = str(p)
        if not is_url(name) and os.path.exists(name):
            info = os.stat(name)
            sources.append([str(Path(name).resolve()), info.st_size, info.st_mtime_ns])
        else:
            sources.append([name])
    return {
        "inputs": sources,
        "variables": {str(v): list(ds[v].shape) for v in ds.data_vars},
        "time": [iso(ds.time.values[0]), iso(ds.time.values[-1])],
        "latitude": [float(ds.latitude.values[0]), float(ds.latitude.values[-1])],
        "longitude": [float(ds.longitude.values[0]), float(ds.longitude.values[-1])],
        "steps": steps,
        "train": list(train),
        "climatology": climatology,
        "block": block,
    }


def _selection_args(start: Any, end: Any, region: Any, levels: Any) -> str:
    args: list[str] = []
    for flag, value in (("--start", start), ("--end", end)):
        if value is not None:
            args += [flag, str(value)]
    if region is not None:
        args += ["--region", region if isinstance(region, str) else ",".join(f"{v:g}" for v in region)]
    if levels is not None:
        args += ["--levels", *(f"{v:g}" for v in levels)]
    return (" " + shlex.join(args)) if args else ""


def data_main(argv: Sequence[str]) -> None:
    """``gridtnp data prepare ...``: the command line (``gridtnp data prepare --help``)."""
    parser = argparse.ArgumentParser(prog="gridtnp data", description="Prepare data for gridtnp.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "prepare",
        help="NetCDF / GRIB files -> a Zarr store in gridtnp's layout, with normalisation statistics",
        description="Convert NetCDF / GRIB / Zarr inputs (local, or a Zarr store at a URL such as ARCO-ERA5) into one "
        "Zarr store in gridtnp's layout (latitudes ascending, "
        "longitudes in [-180, 180), float32, chunked for random access in time), with each variable's mean and std "
        "over the training period in the store's attributes.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="NetCDF (.nc), GRIB (.grib, needs cfgrib) or Zarr (.zarr) inputs, or a Zarr store's URL (gs://, "
        "https://; e.g. ARCO-ERA5, gs:// needs pip install gridtnp[cloud])",
    )
    p.add_argument("--out", required=True, metavar="STORE.zarr", help="the Zarr store to write")
    p.add_argument(
        "--variables",
        nargs="+",
        metavar="VAR",
        help="variables to keep, by archive or short name (2m_temperature or t2m; u850 for one pressure level; "
        "default: every gridded one)",
    )
    p.add_argument("--start", metavar="DATE", help="first date to keep (default: the inputs' first step)")
    p.add_argument("--end", metavar="DATE", help="last date to keep, inclusive (default: the inputs' last step)")
    p.add_argument(
        "--region",
        nargs=4,
        type=float,
        metavar=("LAT_MIN", "LAT_MAX", "LON_MIN", "LON_MAX"),
        help="keep a lat/lon box in degrees; LON_MIN > LON_MAX crosses the date line (e.g. -50 10 160 -160)",
    )
    p.add_argument("--levels", nargs="+", type=float, metavar="HPA", help="pressure levels to keep of level variables")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option of URL inputs, repeatable (e.g. token=anon for a public bucket)",
    )
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="concurrent reads (default: dask's threads)")
    p.add_argument("--coarsen", type=int, default=1, metavar="F", help="average F x F blocks of grid points first")
    p.add_argument(
        "--space-chunk",
        type=int,
        default=None,
        metavar="N",
        help="N x N grid points per chunk (default: the whole grid; smaller for stores read by region)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a dask.distributed scheduler (tcp://host:8786) whose workers read the inputs (pip install "
        "gridtnp[distributed]; the workers must see the input files)",
    )
    p.add_argument("--train-start", metavar="DATE", help="first date of the statistics period (default: first step)")
    p.add_argument("--train-end", metavar="DATE", help="last date of the statistics period, inclusive (default: last)")
    p.add_argument(
        "--time-chunk",
        type=int,
        default=None,
        metavar="N",
        help="time steps per Zarr chunk (default: as many as keep a chunk under 4 MiB, at most 24)",
    )
    p.add_argument(
        "--climatology",
        action="store_true",
        help="also store each variable's mean per grid point and UTC hour over the training period (read by the "
        "DataModules' climatology option instead of a pass over the training period)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="extend the prepared store at --out with the inputs' later time steps (statistics kept)",
    )
    p.add_argument(
        "--recompute-stats",
        action="store_true",
        help="with --append: recompute the statistics (and climatology) over --train-start/--train-end "
        "(default: the recorded period)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    opts = parser.parse_args(list(argv))
    if opts.append:
        from gridtnp.data.append import append

        append(
            opts.inputs,
            opts.out,
            recompute_stats=opts.recompute_stats,
            train_start=opts.train_start,
            train_end=opts.train_end,
            storage_options=_storage_options(opts.storage_option),
            jobs=opts.jobs,
            progress=not opts.quiet,
        )
        return
    prepare(
        opts.inputs,
        opts.out,
        variables=opts.variables,
        train_start=opts.train_start,
        train_end=opts.train_end,
        time_chunk=opts.time_chunk,
        overwrite=opts.overwrite,
        progress=not opts.quiet,
        climatology=opts.climatology,
        start=opts.start,
        end=opts.end,
        region=opts.region,
        levels=opts.levels,
        storage_options=_storage_options(opts.storage_option),
        jobs=opts.jobs,
        scheduler=opts.scheduler,
        coarsen=opts.coarsen,
        space_chunk=opts.space_chunk,
    )


def _storage_options(pairs: Sequence[str]) -> dict[str, Any] | None:
    """``["token=anon"]`` -> ``{"token": "anon"}`` (None when empty)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DataError(f"--storage-option {pair!r}: expected KEY=VALUE, e.g. token=anon.")
        out[key] = value
    return out or None


def is_zarr_store(path: Path) -> bool:
    """Whether ``path`` is a directory holding Zarr (v2 or v3) metadata at its root."""
    return path.is_dir() and any((path / name).exists() for name in ("zarr.json", ".zgroup", ".zmetadata"))


def is_prepared_store(path: Path) -> bool:
    """Whether ``path`` is a store ``gridtnp data prepare`` wrote (its root attributes hold the statistics)."""
    attrs = path / ".zattrs"
    try:
        return STATS_ATTR in json.loads(attrs.read_text())
    except (OSError, ValueError):
        return False


def remove_leftovers(out: Path) -> None:
    """Delete temporaries of earlier runs into ``out`` that were killed before their rename (``.<name>.tmp-*``)."""
    for leftover in out.parent.glob(f".{out.name}.tmp-*"):
        remove_path(leftover)


def _to_float32(ds: xr.Dataset) -> xr.Dataset:
    """float32 data variables with the source's NetCDF/GRIB encoding (packing, fill values, chunks) dropped."""
    ds = ds.copy()
    for name in ds.data_vars:
        ds[name] = ds[name].astype(np.float32)
    for var in ds.variables.values():
        var.encoding = {}
    return ds


def _stats_attr(stats: dict[str, dict[str, Any]], train: xr.Dataset, inputs: Sequence[Any]) -> dict[str, Any]:
    first, last = iso(train.time.values[0]), iso(train.time.values[-1])
    out = {}
    for v, computed in stats.items():
        mean, std = float(computed["mean"]), float(computed["std"])
        if not (np.isfinite(mean) and np.isfinite(std)):
            raise DataError(
                f"{', '.join(map(str, inputs))}: variable {v!r} has no finite values between {first} and {last}; "
                "choose a training period with data (--train-start/--train-end)."
            )
        out[v] = {"mean": mean, "std": std, "train_start": first, "train_end": last, "steps": int(train.sizes["time"])}
        if "levels" in computed:
            levels, means, stds = computed["levels"]
            out[v]["levels"] = {
                f"{level:g}": {"mean": float(m), "std": float(sd)}
                for level, m, sd in zip(levels, np.asarray(means), np.asarray(stds), strict=True)
            }
    return out


def _provenance(
    inputs: Sequence[Any],
    out: Path,
    variables: Sequence[str] | None,
    start: str | None,
    end: str | None,
    steps: int,
    climatology: bool = False,
) -> dict[str, Any]:
    args = ["gridtnp", "data", "prepare", *map(str, inputs), "--out", str(out)]
    if variables:
        args += ["--variables", *variables]
    for flag, value in (("--train-start", start), ("--train-end", end)):
        if value is not None:
            args += [flag, str(value)]
    args += ["--time-chunk", str(steps)]
    if climatology:
        args.append("--climatology")
    try:
        version = metadata.version("gridtnp")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "sources": [str(Path(p).resolve()) for p in inputs],
        "command": shlex.join(args),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gridtnp_version": version,
    }


def _finish_store(
    tmp: Path, stats: dict[str, Any], provenance: dict[str, Any], extra: dict[str, Any] | None = None
) -> None:
    """Add the gridtnp attributes (and ``extra`` ones) and consolidate the metadata (one read for remote copies)."""
    import zarr

    group = zarr.open_group(str(tmp), mode="r+")
    variables = [name for name in stats]  # the data variables (coordinates have no statistics)
    attrs = {STATS_ATTR: stats, PROVENANCE_ATTR: provenance, CHUNKS_ATTR: inventory(tmp, variables)}
    group.attrs.update({**attrs, **(extra or {})})
    zarr.consolidate_metadata(str(tmp))


def _check_target(out: Path, overwrite: bool) -> None:
    if not out.exists():
        if not out.parent.is_dir():
            raise DataError(f"--out {out}: the folder {out.parent} does not exist; create it first.")
        return
    if not overwrite:
        raise DataError(
            f"--out {out} already exists; pass --overwrite to replace it (the new store is written next to it "
            "first, so the old one stays intact if preparation fails)."
        )
    if not is_zarr_store(out):
        raise DataError(f"--out {out} exists and is not a Zarr store; refusing to replace it. Choose another path.")
    if not is_prepared_store(out):
        raise DataError(
            f"--out {out} is a Zarr store that gridtnp data prepare did not write (e.g. predictions); refusing to "
            "replace it even with --overwrite. Choose another path."
        )


def _describe_vars(ds: xr.Dataset) -> str:
    return ", ".join(f"{v} {tuple(map(str, da.dims))}" for v, da in ds.data_vars.items()) or "(none)"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def _zarr_major() -> int:
    return int(metadata.version("zarr").split(".")[0])


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _silent(*args: Any, **kwargs: Any) -> None:
    pass
