"""``gridtnp data prepare``'s writer: the store written block by block in time, resumable after a kill.

Each block (whole time chunks, about ``BLOCK_BYTES`` of float32, 128 MiB) is read concurrently (dask, ``jobs``
threads, or the ``dask.distributed`` cluster of an active ``Client``), written into the Zarr arrays, and folded
into running statistics: per variable (and level) the count, mean and sum of squared deviations of the finite
training values (merged block by block, Chan et al.), and with ``climatology`` the float64 sums per grid point and
UTC hour of day (``HourlySums``: the steps per hour, and counts of missing values only once a variable has one).
The next block is read while one is written. Memory is two blocks and the climatology sums, whatever the number
of inputs, beside the task graph (about 150 bytes a task: 200 MB for a decade of hourly steps of two variables).
Locally, the inputs' tasks are materialised once and each block computes only its own (``BlockReader``): computing
a slice of the whole graph walks every input file's tasks for every block.

A checkpoint (``STATE``: the blocks done and the statistics so far, in the partial store) is saved every
``checkpoint_s`` seconds; a rerun of the same request (same ``fingerprint``) resumes after the last checkpoint's
blocks, rewriting none of them, and gives the store an uninterrupted run gives (the blocks and the order of the
merges are the same).

* ``write_blocks(ds, store, train, fingerprint, ...) -> (stats, climatology)``: write ``ds``'s data into the
  arrays of ``store`` (already created), return ``{variable: {"mean", "std"[, "levels"]}}`` and the climatology
  (an ``xarray.Dataset`` ``[hour, ..., lat, lon]`` or None).
* ``block_steps(ds, steps)``: time steps per block (a multiple of the chunk's ``steps``).
"""

from __future__ import annotations

import functools
import json
import math
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dask
import dask.array
import dask.local
import dask.threaded
import numpy as np
import xarray as xr
from dask.array.core import concatenate3
from dask.base import get_scheduler
from dask.optimization import cull

from gridtnp.data.prepare.statistics import HourlySums, RunningMoments, mask_fill_values
from gridtnp.files import atomic_write

STATE = ".gridtnp_prepare_state.json"
CLIMATOLOGY_SUMS = ".gridtnp_prepare_climatology.npz"
BLOCK_BYTES = 128 * 2**20


def block_steps(ds: xr.Dataset, steps: int, target: int = BLOCK_BYTES) -> int:
    """Time steps per block: whole chunks of ``steps``, about ``target`` bytes of float32 over every variable."""
    per_step = sum(4 * int(np.prod([ds.sizes[d] for d in v.dims if d != "time"])) for v in ds.data_vars.values())
    return steps * max(1, target // max(per_step * steps, 1))


class BlockReader:
    """Steps ``[a, b)`` of dask arrays ``[T, ...]`` computed from their tasks, materialised once: each read culls and
    optimises only the tasks of its blocks. ``dask.compute`` of a slice walks the whole graph, every input file's
    tasks, for every block (0.6-3 s a block for 1,000 daily files, against about 10 ms here)."""

    def __init__(self, arrays: list[dask.array.Array], get: Callable[..., Any]) -> None:
        self.graph: dict[Any, Any] = {}
        for x in arrays:
            self.graph.update(x.__dask_graph__())
        self.keys = [x.__dask_keys__() for x in arrays]
        self.bounds = [np.cumsum((0, *x.chunks[0])) for x in arrays]
        self.get = get

    def read(self, a: int, b: int) -> tuple[np.ndarray, ...] | None:
        """Every array's steps ``[a, b)``, or None where ``a`` or ``b`` is not a block boundary of every array."""
        nested = []
        for keys, bounds in zip(self.keys, self.bounds, strict=True):
            i, j = np.searchsorted(bounds, [a, b])
            if j >= len(bounds) or bounds[i] != a or bounds[j] != b:
                return None
            nested.append(keys[i:j])
        flat = list(dask.core.flatten(nested))
        graph, _ = cull(self.graph, flat)
        values = dict(zip(flat, self.get(dask.array.optimization.optimize(graph, flat), flat), strict=True))
        return tuple(concatenate3(_arrays(n, values)) for n in nested)


def _arrays(nested: Any, values: dict[Any, np.ndarray]) -> Any:
    """``nested`` (lists of task keys) with each key replaced by its value."""
    return [_arrays(item, values) for item in nested] if isinstance(nested, list) else values[nested]


def write_blocks(
    ds: xr.Dataset,
    store: Path,
    train: tuple[int, int],
    fingerprint: dict[str, Any],
    steps: int,
    climatology: bool = False,
    jobs: int | None = None,
    checkpoint_s: float = 30.0,
    log: Callable[[str], None] = print,
    every: float = 10.0,
    block: int | None = None,
    offset: int = 0,
    write: bool = True,
) -> tuple[dict[str, dict[str, Any]], xr.Dataset | None]:
    """Write the data of ``ds`` (lazy, chunked ``steps`` in time) into ``store``'s arrays block by block, from time
    index ``offset`` of the arrays on (``write=False``: only read, for the statistics); the statistics and
    climatology are over the time indices ``train = (first, stop)`` of ``ds``. Resumes from ``store``'s
    checkpoint when its fingerprint equals ``fingerprint``."""
    import zarr

    # Not the consolidated metadata: after an append it still has the arrays' old shapes (writes would be clipped).
    unconsolidated = {"use_consolidated": False} if int(zarr.__version__.split(".")[0]) >= 3 else {}
    group = zarr.open_group(str(store), mode="r+" if write else "r", **unconsolidated)
    names = [str(v) for v in ds.data_vars]
    level_axis = {v: (1 if ds[v].ndim == 4 else None) for v in names}
    moments = {v: RunningMoments(ds[v].shape[1] if level_axis[v] else 1) for v in names}
    hour_of_day = ds.indexes["time"].hour.to_numpy()
    clim = HourlySums({v: ds[v].shape[1:] for v in names}) if climatology else None
    size = block or block_steps(ds, steps)
    total = ds.sizes["time"]
    starts = list(range(0, total, size))
    done = _resume(store, fingerprint, moments, clim)
    if done:
        log(f"gridtnp data prepare: resuming after {done} of {len(starts)} blocks ({starts[done]} of {total} hours)")
    nbytes = sum(4 * int(np.prod(ds[v].shape)) for v in names)
    started, last_log, last_save = time.perf_counter(), 0.0, time.perf_counter()
    first_hour = starts[done] if done < len(starts) else total

    # jobs 1: every chunk read in the reading thread, without dask's thread pool (NetCDF/HDF5 reads take a global
    # lock, so more threads only contend for it); else ``jobs`` threads, or the active distributed client's workers.
    options: dict[str, Any] = {"scheduler": "sync"} if jobs == 1 else ({"num_workers": jobs} if jobs else {})

    blocks = None
    if all(isinstance(ds[v].data, dask.array.Array) for v in names) and get_scheduler() is None:
        get = dask.local.get_sync if jobs == 1 else functools.partial(dask.threaded.get, num_workers=jobs)
        blocks = BlockReader([ds[v].data for v in names], get)  # not on a distributed cluster: its own scheduler

    def read(index: int) -> tuple[np.ndarray, ...]:
        a, b = starts[index], min(starts[index] + size, total)
        values = blocks.read(a, b) if blocks is not None else None
        return values if values is not None else dask.compute(*[ds[v].data[a:b] for v in names], **options)

    fills = dict.fromkeys(names, 0)
    # The next block is read while this one is written and folded into the statistics (two blocks in memory), so
    # reading (decompression, a remote store's round trips) overlaps writing (compression) and the statistics.
    with ThreadPoolExecutor(1, thread_name_prefix="gridtnp-prepare-read") as reader:
        upcoming = reader.submit(read, done) if done < len(starts) else None
        for index in range(done, len(starts)):
            a, b = starts[index], min(starts[index] + size, total)
            arrays = upcoming.result()
            upcoming = reader.submit(read, index + 1) if index + 1 < len(starts) else None
            for i, (v, values) in enumerate(zip(names, arrays, strict=True)):
                values, fills[v] = mask_fill_values(values, fills[v])
                if write:
                    group[v][offset + a : offset + b] = values
                lo, hi = max(a, train[0]), min(b, train[1])
                if lo < hi:
                    part = values[lo - a : hi - a]
                    finite = moments[v].add(part, level_axis[v])
                    if clim is not None:
                        clim.add(v, part, hour_of_day[lo:hi], count_steps=i == 0, finite=finite)
            now = time.perf_counter()
            if write and (now - last_save >= checkpoint_s or index == len(starts) - 1):
                save_state(store, fingerprint, index + 1, moments, clim)
                last_save = now
            if now - last_log >= every or index == len(starts) - 1:
                last_log = now
                log(
                    _progress_line(b - first_hour, total - first_hour, nbytes * (b - first_hour) / total, now - started)
                )
    for v, count in fills.items():
        if count:
            warnings.warn(
                f"{v}: {count:,} value(s) beyond +-1e30 or infinite (a fill value the input does not "
                "declare as _FillValue or missing_value?) are stored as missing (NaN), outside the statistics.",
                stacklevel=2,
            )
    stats = {}
    for v in names:
        mean, std = moments[v].result()
        entry: dict[str, Any] = {}
        if level_axis[v] is not None:
            counts = moments[v].n
            pooled = RunningMoments(1)
            pooled.n = np.array([counts.sum()])
            with np.errstate(invalid="ignore", divide="ignore"):
                pooled.mean = np.array([np.nansum(mean * counts) / counts.sum()])
            pooled.m2 = np.array([np.nansum(moments[v].m2) + np.nansum(counts * (mean - pooled.mean[0]) ** 2)])
            overall_mean, overall_std = pooled.result()
            entry = {"mean": overall_mean[0], "std": overall_std[0]}
            entry["levels"] = (ds[v][ds[v].dims[1]].values, mean, std)
        else:
            entry = {"mean": mean[0], "std": std[0]}
        stats[v] = entry
    return stats, (clim.means(ds) if clim is not None else None)


def save_state(
    store: Path,
    fingerprint: dict[str, Any],
    done: int,
    moments: dict[str, RunningMoments],
    clim: HourlySums | None,
) -> None:
    """Checkpoint: the climatology sums first, then the state naming them (a kill between leaves the old state)."""
    if clim is not None:
        arrays = clim.arrays()
        atomic_write(store / f"{CLIMATOLOGY_SUMS}.{done}", lambda f: np.savez(f, **arrays))
    state = {"fingerprint": fingerprint, "done": done, "moments": {v: m.state() for v, m in moments.items()}}
    atomic_write(store / STATE, lambda f: f.write(json.dumps(state).encode()))
    for old in store.glob(f"{CLIMATOLOGY_SUMS}.*"):
        if old.name != f"{CLIMATOLOGY_SUMS}.{done}":
            old.unlink(missing_ok=True)


def _resume(
    store: Path,
    fingerprint: dict[str, Any],
    moments: dict[str, RunningMoments],
    clim: HourlySums | None,
) -> int:
    """Blocks done by an earlier run of the same request into ``store`` (0 if none), its statistics loaded."""
    try:
        state = json.loads((store / STATE).read_text())
    except (OSError, ValueError):
        return 0
    if state.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        return 0
    done = int(state["done"])
    if done == 0:
        return 0
    if clim is not None:
        try:
            with np.load(store / f"{CLIMATOLOGY_SUMS}.{done}") as saved:
                clim.load(saved)
        except (OSError, KeyError, ValueError):
            return 0
    for v, m in moments.items():
        loaded = RunningMoments.from_state(state["moments"][v])
        m.n, m.mean, m.m2 = loaded.n, loaded.mean, loaded.m2
    return done


def state_matches(store: Path, fingerprint: dict[str, Any]) -> bool:
    """Whether ``store`` holds a checkpoint of the request ``fingerprint`` (a killed run to resume)."""
    try:
        state = json.loads((store / STATE).read_text())
    except (OSError, ValueError):
        return False
    return state.get("fingerprint") == json.loads(json.dumps(fingerprint))


def clear_state(store: Path) -> None:
    """Remove the checkpoint files from a finished store."""
    (store / STATE).unlink(missing_ok=True)
    for path in store.glob(f"{CLIMATOLOGY_SUMS}*"):
        path.unlink(missing_ok=True)


def _progress_line(done: int, total: int, nbytes: float, elapsed: float) -> str:
    share = done / total if total else 1.0
    rate = nbytes / max(elapsed, 1e-9) / 1e6
    left = elapsed * (1 - share) / share if share > 0 else math.nan
    return (
        f"gridtnp data prepare: hours {done:,} / {total:,} ({100 * share:.0f} %), {rate:.0f} MB/s, "
        f"{_duration(left)} left"
    )


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
