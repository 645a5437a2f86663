"""``gridtnp data prepare``: NetCDF / GRIB / Zarr inputs -> one Zarr store in gridtnp's layout, with statistics.

gridtnp data prepare era5_2019-03.nc --out era5.zarr --train-start 2019-03-01 --train-end 2019-03-21

The store holds float32 variables ``[time, ..., latitude, longitude]`` chunked ``time_chunk x full grid`` (one read
per sampled time step; ``--space-chunk`` splits the grid too), latitudes ascending, longitudes ascending in
[-180, 180), ``time`` as datetime64, CF attributes kept; ``attrs["gridtnp_stats"]`` has each variable's mean and std
over the training period (``train_start``/``train_end``, the whole input when unset: the DataModules then refuse
validation or test dates inside it) and ``attrs["gridtnp_provenance"]`` the sources and the command. Inputs are
local NetCDF / GRIB / Zarr files or Zarr stores at a URL (e.g. ARCO-ERA5), with variables by archive or short name
(``gridtnp.data.archive``), cut to dates, a region and levels first. The data is written block by block into
``.<name>.partial`` beside the target (``gridtnp.data.prepare.writer``: bounded memory, a checkpoint to resume a
killed run), then renamed into place: an interrupted run leaves the old store or none under the target's name, never a
half-written one (a crash between the two renames of ``--overwrite`` leaves the old store aside as
``.<name>.old-*``). The rename is atomic, the store's files are not fsynced (xarray's Zarr writer does not).
``--append`` extends a store with later steps (``gridtnp.data.prepare.append``).

* ``prepare(inputs, out, variables, train_start, train_end, time_chunk, ...)``: write the store, return its path.
* ``gridtnp.data.prepare.command.data_main(argv)`` is the CLI. Opening the inputs: ``gridtnp.data.prepare.inputs``;
  the store around the data: ``gridtnp.data.prepare.output_store``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from gridtnp.data.archive import parse_region
from gridtnp.data.climatology import CLIMATOLOGY_ATTR, write_climatology
from gridtnp.data.layout import (
    DataError,
    coverage,
    iso,
    select_time,
)
from gridtnp.data.prepare.input_checks import check_jobs, check_writable, warn_time_gaps
from gridtnp.data.prepare.inputs import (
    NETCDF_CHUNK_CACHE,
    Selection,
    auto_time_chunk,
    netcdf_chunk_cache,
    open_sources,
    space_chunks,
)
from gridtnp.data.prepare.output_store import (
    ZARR_FORMAT,
    as_written,
    check_target,
    finish_store,
    provenance_attr,
    remove_leftovers,
    size_mb,
    stats_attr,
    zarr_major,
)
from gridtnp.data.prepare.writer import clear_state, state_matches, write_blocks
from gridtnp.files import is_url, out_of_space, remove_path, replace_path
from gridtnp.locks import locked_output


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

    ``time_chunk`` steps per chunk; None picks the most steps (at most 24) whose chunk of the largest variable stays
    under 4 MiB: 24 for a regional box, 1 for a global 0.25 degree grid (721 x 1,440: 4.0 MiB a step).
    ``climatology``: also store each variable's mean per grid point and UTC hour of day over the training period
    (``gridtnp.data.climatology``), in the same pass over the inputs. ``start``/``end`` (inclusive dates),
    ``region`` (``lat_min, lat_max, lon_min, lon_max``; across the date line when ``lon_min > lon_max``) and
    ``levels`` cut the inputs first; ``variables`` may then use archive or short names (``gridtnp.data.archive``);
    ``storage_options``: fsspec options of URL inputs (``{"token": "anon"}`` for public buckets). The data is
    written in blocks of ``block_steps`` time steps (default about 128 MiB), read with ``jobs`` threads (default:
    dask's for Zarr inputs, 1 for local NetCDF/GRIB files, whose reads take a lock; or on the cluster of an active
    ``dask.distributed`` client), the next block while one is written; a checkpoint every ``checkpoint_s`` seconds
    lets a rerun of a killed prepare resume (``gridtnp.data.prepare.writer``). ``scheduler``: the address of a
    ``dask.distributed`` scheduler (``tcp://host:8786``) whose workers do the reading (they must see the inputs);
    the store is the one a local run writes. ``coarsen``: average ``coarsen x coarsen`` blocks of grid points first
    (NaN-aware; a partial block at the end of an axis is dropped). ``space_chunk``: grid points per chunk along
    latitude and longitude (default: the whole grid), so that a task on a region reads only the chunks over it.
    """
    log = print if progress else _silent
    out_path = Path(out)
    if is_url(out):
        raise DataError(f"--out {out}: prepare writes a local store; copy it to remote storage afterwards.")
    if time_chunk is not None and time_chunk < 1:
        raise DataError(f"--time-chunk {time_chunk}: expected a positive number of time steps per chunk.")
    check_jobs(jobs)
    check_target(out_path, overwrite)
    check_writable(out_path, "--out")

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    box = parse_region(region) if region is not None else None
    selection = Selection(start, end, box, list(levels) if levels is not None else None, storage_options)
    if jobs is None and scheduler is None and all(locked_reads(path) for path in inputs):
        jobs = 1  # NetCDF/GRIB reads are serialised by a lock: threads only contend for it
    log(f"gridtnp data prepare: [1/4] opening {len(inputs)} input file(s)")
    with locked_output(out_path), netcdf_chunk_cache(NETCDF_CHUNK_CACHE), _cluster(scheduler, log):
        source = open_sources(inputs, variables, time_chunk, selection)
        try:
            ds = as_written(source, coarsen)
            warn_time_gaps(ds.indexes["time"], f"{len(inputs)} input(s) from {inputs[0]}")
            space = space_chunks(ds, space_chunk)
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
                store_kwargs = {"zarr_format": ZARR_FORMAT} if zarr_major() >= 3 else {}
                ds.to_zarr(partial, mode="w-", encoding=encoding, consolidated=False, compute=False, **store_kwargs)
            try:
                stats, clim = write_blocks(
                    ds, partial, train_span, fingerprint, steps, climatology, jobs, checkpoint_s, log, block=block_steps
                )
            except DataError:
                raise
            except Exception as err:
                if out_of_space(err):
                    raise  # one line from the command (gridtnp.data.prepare.command)
                raise DataError(
                    f"Reading {', '.join(map(str, inputs))} failed while writing ({type(err).__name__}: {err}); "
                    "is an input file truncated or corrupt? (Rerun the same command to resume.)"
                ) from err
            statistics = stats_attr(stats, train, inputs)
            extra = {CLIMATOLOGY_ATTR: write_climatology(partial, clim, train)} if clim is not None else {}
            provenance = provenance_attr(inputs, out_path, variables, train_start, train_end, steps, climatology)
            provenance["command"] += _selection_args(start, end, box, levels, coarsen, space_chunk)
            # What --append cuts its inputs to, so that they land on this store's grid and levels.
            provenance["selection"] = {
                "region": list(box) if box is not None else None,
                "levels": [float(v) for v in levels] if levels is not None else None,
                "coarsen": coarsen,
            }
            clear_state(partial)
            finish_store(partial, statistics, provenance, extra)
            log(f"gridtnp data prepare: [4/4] moving the new store into place at {out_path}")
            replace_path(partial, out_path)
        finally:
            source.close()
    for v, s in statistics.items():
        log(f"gridtnp data prepare: {v}: mean {s['mean']:.6g}, std {s['std']:.6g} {ds[v].attrs.get('units', '')}")
    log(f"gridtnp data prepare: done, {size_mb(out_path):.1f} MB at {out_path}")
    return out_path


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
    try:
        client = Client(address)
    except (OSError, ValueError, TypeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(
            f"--scheduler {address}: no dask.distributed scheduler reached ({reason}); give the address of a running "
            "scheduler this machine can reach (tcp://host:8786), or leave --scheduler out to read here."
        ) from None
    with client:
        workers = len(client.scheduler_info()["workers"])
        log(f"gridtnp data prepare: reading on the cluster at {address} ({workers} workers)")
        yield


def locked_reads(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a local NetCDF or GRIB file: its reads go through a library lock (HDF5, ecCodes)."""
    name = str(path).rstrip("/")
    return not is_url(name) and Path(name).suffix.lower() != ".zarr"


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


def _selection_args(
    start: Any, end: Any, region: Any, levels: Any, coarsen: int = 1, space_chunk: int | None = None
) -> str:
    args: list[str] = []
    for flag, value in (("--start", start), ("--end", end)):
        if value is not None:
            args += [flag, str(value)]
    if region is not None:
        args += ["--region", *(f"{v:g}" for v in region)]  # four arguments, as the command line takes them
    if levels is not None:
        args += ["--levels", *(f"{v:g}" for v in levels)]
    if coarsen > 1:
        args += ["--coarsen", str(coarsen)]
    if space_chunk is not None:
        args += ["--space-chunk", str(space_chunk)]
    return (" " + shlex.join(args)) if args else ""


def _silent(*args: Any, **kwargs: Any) -> None:
    pass
