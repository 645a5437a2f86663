"""Bytes read from storage per training task and what 32 GPUs need (``benchmarks/data_loading.py --scale --storage``).

For the station task, a multi-source task over Europe (both on the global 0.25 degree store of ``--scale``) and the
multi-source task at the size of the paper's Table 2 (6 sources, u and v at 700, 850 and 1000 hPa, 96 x 236 points,
windows of 4 hours, batch 8; on a synthetic store of that shape), each with ``store.tasks_per_read`` 1 and more:
the stored chunks one process's training loader reads (``ChunkCache.loaded``; each read whole, so a region of a
store not chunked in space costs its full chunks), in decoded bytes and on disk (the variable's chunk files' mean
size), the distinct hours per batch, and the storage rate
``bytes per task x tasks/s per GPU x GPUs`` at the GPU rates recorded in ``benchmarks/results`` (the station task)
or given (``--multisource-gpu-rate``, no multi-source rate having been measured on a GPU). Then the Table 2 task's
tasks per CPU second in one process (0 workers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gridtnp.data import MultiSourceDataModule, StationReanalysisDataModule
from gridtnp.data.layout import PROVENANCE_ATTR, STATS_ATTR
from gridtnp.data.prepare.inputs import auto_time_chunk
from gridtnp.data.sections import from_flat_arguments

TABLE2_REGION = (25.0, 48.75, -125.0, -66.25)  # recipes/paper/table2_*.yaml: 96 x 236 points
TABLE2_SOURCES = ["u@700", "v@700", "u@850", "v@850", "u@1000", "v@1000"]
TABLE2_DATES = {"train_dates": ("2019-01-01", "2019-03-31"), "val_dates": ("2019-04-01", "2019-04-05"),
                "test_dates": ("2019-04-06", "2019-04-10")}  # fmt: skip


def table2_store(directory: Path, hours: int = 2400) -> Path:
    """A store shaped like the Table 2 recipes' ``era5_wind_us.zarr``: ``u``, ``v [hours, 3, 96, 236]`` float32
    (levels 700, 850, 1000 hPa) in time chunks of ``auto_time_chunk`` (15 steps), a smooth field plus noise;
    100 days by default, so that a batch's 8 windows seldom share a chunk (as over the recipes' 9 years)."""
    import dask.array as da
    import xarray as xr

    path = directory / f"synthetic_wind_us_{hours}h.zarr"
    if path.exists():
        return path
    lat = np.arange(TABLE2_REGION[0], TABLE2_REGION[1] + 0.125, 0.25)
    lon = np.arange(TABLE2_REGION[2], TABLE2_REGION[3] + 0.125, 0.25)
    shape = (hours, 3, lat.size, lon.size)

    def block(block_info: dict | None = None) -> np.ndarray:
        (t0, t1), *_ = block_info[None]["array-location"]
        hour = np.arange(t0, t1)[:, None, None, None]
        smooth = 10.0 * np.sin(2 * np.pi * hour / 24.0 + np.deg2rad(lon)) * np.cos(np.deg2rad(lat))[:, None]
        noise = np.random.default_rng(t0).standard_normal((t1 - t0, *shape[1:]), dtype=np.float32)
        return (smooth + noise).astype(np.float32)

    probe = xr.Dataset({"u": (("time", "level", "latitude", "longitude"), da.zeros(shape, np.float32, chunks=-1))})
    chunks = da.core.normalize_chunks((auto_time_chunk(probe), *shape[1:]), shape)
    dims = ("time", "level", "latitude", "longitude")
    data = {
        v: (dims, da.map_blocks(block, dtype=np.float32, chunks=chunks, meta=np.array((), np.float32)),
            {"units": "m s**-1"})
        for v in ("u", "v")
    }  # fmt: skip
    coords = {"time": pd.date_range("2019-01-01", periods=hours, freq="h"), "level": [700.0, 850.0, 1000.0]}
    ds = xr.Dataset(data, coords={**coords, "latitude": lat, "longitude": lon})
    ds.attrs[STATS_ATTR] = {v: {"mean": 0.0, "std": 7.0} for v in ("u", "v")}
    ds.attrs[PROVENANCE_ATTR] = {"created_by": "benchmarks/storage_rate.py (synthetic)"}
    tmp = path.with_name(path.name + ".tmp")
    ds.to_zarr(tmp, mode="w", zarr_format=2, consolidated=True)
    tmp.rename(path)
    return path


def chunk_bytes(store: str, variable: str, region: dict[str, slice]) -> tuple[float, float]:
    """Decoded and on-disk bytes a read of one time chunk of ``variable`` takes from a local store: every stored
    chunk that overlaps ``region`` (index slices of latitude and longitude) is read whole, and the on-disk bytes
    are the variable's mean compression over its chunk files."""
    import xarray as xr

    var = xr.open_zarr(store)[variable]
    chunks = dict(zip(var.dims, var.encoding["chunks"], strict=True))
    decoded = var.dtype.itemsize * int(np.prod([chunks[d] for d in var.dims]))
    for dim in ("latitude", "longitude"):
        span = region.get(dim, slice(0, var.sizes[dim]))
        decoded *= -(-span.stop // chunks[dim]) - span.start // chunks[dim]
    files = [f for f in Path(store, variable).rglob("*") if f.is_file() and not f.name.startswith((".", "zarr."))]
    ratio = sum(f.stat().st_size for f in files) / (var.dtype.itemsize * int(np.prod(var.shape)))
    return float(decoded), float(decoded * ratio)


def read_volume(make: Callable[[int], Any], tasks_per_read: int, batches: int) -> dict[str, float]:
    """Bytes read from storage per task (decoded and on disk), chunks per task and distinct hours per batch of one
    process's training loader (0 workers: the chunk cache's counters are this process's), each batch from an empty
    cache: the tasks of a batch share what it reads, and a short store's reuse across batches is not counted."""
    dm = make(tasks_per_read)
    dm.setup()
    tasks, hours, cache = 0, [], dm.task.cache
    for batch in dm.train_dataloader():
        cache._lru.clear()  # no chunk kept for the next batch: a store of years, sampled at random, keeps none
        tasks += batch.batch_size
        hour = batch.extras.get("hour", batch.extras.get("start_hour"))
        hours.append(len(np.unique(hour.numpy())))
        if len(hours) == batches:
            break
    size = {v: chunk_bytes(cache.store, v, cache.region) for v in cache.variables}
    return {
        "decoded": sum(size[v][0] for v, _ in cache.loaded) / tasks,
        "compressed": sum(size[v][1] for v, _ in cache.loaded) / tasks,
        "delivered": cache.bytes_read / tasks,
        "chunks": cache.reads / tasks,
        "hours": float(np.mean(hours)),
        "batch": dm.batch_size,
        "tasks": tasks,
    }


def storage_rows(
    store: str,
    station: dict[str, Any],
    common: dict[str, Any],
    store_dir: Path,
    gpu_rates: dict[str, float],
    tasks_per_read: list[int],
    batches: int,
    gpus: int = 32,
) -> list[dict[str, Any]]:
    """Rows of bytes per task and the ``gpus``-GPU storage rate for the three cases, each ``tasks_per_read``."""
    wind = str(table2_store(store_dir))
    wind_dates = TABLE2_DATES
    cases = {
        "station task (era5_swin_global.yaml data)": (
            lambda k: from_flat_arguments(
                StationReanalysisDataModule, store=store, climatology=False, tasks_per_read=k, **station, **common
            ),
            gpu_rates["station"],
        ),
        "multi-source Europe, window 4 (t2m, skt)": (
            lambda k: from_flat_arguments(
                MultiSourceDataModule,
                store=store,
                variables=["t2m", "skt"],
                region=(35.0, 70.0, -15.0, 40.0),
                window=4,
                tasks_per_read=k,
                **common,
            ),
            gpu_rates["multisource"],
        ),
        "multi-source Table 2 size (6 sources, 96 x 236, window 4)": (
            lambda k: table2_module(wind, wind_dates, common["train_batches"], k),
            gpu_rates["multisource"],
        ),
    }
    rows = []
    for name, (make, rate) in cases.items():
        for k in tasks_per_read:
            r = read_volume(make, k, batches)
            need = r["decoded"] * rate * gpus / 1e9
            need_c = r["compressed"] * rate * gpus / 1e9
            print(f"{name} tasks_per_read {k}: {r['decoded'] / 1e6:.1f} MB/task decoded, "
                  f"{r['compressed'] / 1e6:.1f} compressed; {gpus} GPUs: {need:.1f} GB/s", flush=True)  # fmt: skip
            rows.append(
                {
                    "case": f"local: {name}, tasks_per_read {k}",
                    "workers": 0,
                    "tasks/s (wall)": "-",
                    "tasks/s per CPU s": "-",
                    "notes": f"{r['decoded'] / 1e6:.2f} MB/task decoded, {r['compressed'] / 1e6:.2f} MB/task "
                    f"on disk ({r['delivered'] / 1e6:.2f} MB in the region), {r['chunks']:.2f} chunks/task, "
                    f"{r['hours']:.1f} distinct hours per batch of "
                    f"{r['batch']}; {gpus} GPUs at {rate:g} tasks/s each: {need:.1f} GB/s decoded, {need_c:.1f} GB/s "
                    f"on disk ({r['tasks']} tasks)",
                }
            )
    return rows


def table2_module(store: str, dates: dict[str, Any], batches: int, tasks_per_read: int = 1, workers: int = 0) -> Any:
    """The data section of ``recipes/paper/table2_swin_multi_pt_24x60.yaml`` on ``store`` (the synthetic one)."""
    return from_flat_arguments(
        MultiSourceDataModule, store=store, region=TABLE2_REGION, cache_chunks=2, variables=TABLE2_SOURCES,
        window=4, context_fraction=(0.05, 0.25), target_fraction=0.25, batch_size=8, train_batches=batches,
        num_workers=workers, tasks_per_read=tasks_per_read, **dates,
    )  # fmt: skip


def table2_cpu_rows(store_dir: Path, batches: int, repeat: int) -> list[dict[str, Any]]:
    """Tasks per CPU second of the Table 2 multi-source task in one process (0 workers), the median of ``repeat``."""
    store = str(table2_store(store_dir))
    dates = TABLE2_DATES
    rates = []
    for _ in range(repeat):
        dm = table2_module(store, dates, batches + 1)
        dm.setup()
        loader = iter(dm.train_dataloader())
        first = next(loader)
        cpu, start, count = time.process_time(), time.perf_counter(), 0
        for batch in loader:
            count += batch.batch_size
        rates.append((count / (time.process_time() - cpu), count / (time.perf_counter() - start)))
    per_cpu, wall = (float(np.median([r[i] for r in rates])) for i in (0, 1))
    spread = ", ".join(f"{r[0]:.1f}" for r in rates)
    print(f"Table 2 multi-source, one process: {per_cpu:.1f} tasks per CPU s ({spread}), load {os.getloadavg()}")
    return [
        {
            "case": "local: multi-source Table 2 size (6 sources, 96 x 236, window 4), one process",
            "workers": 0,
            "tasks/s (wall)": f"{wall:.1f}",
            "tasks/s per CPU s": f"{per_cpu:.1f}",
            "notes": f"batch {first.batch_size}, {batches} batches timed; median of {repeat} runs, per CPU s {spread}",
        }
    ]


def recorded_station_rate(results: Path, device: str = "H200") -> tuple[float, str]:
    """The highest ``gridtnp fit`` rate (tasks/s) of the station task recorded on ``device`` in
    ``results/gpu_training_global_*.csv``, and the file it is from."""
    import csv

    best = (0.0, "")
    for path in sorted(results.glob("gpu_training_global_*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                fit = row["measure"].startswith("gridtnp fit") and device in row["device"]
                if fit and row["tasks/s"] not in ("", "-") and float(row["tasks/s"]) > best[0]:
                    best = (float(row["tasks/s"]), path.name)
    if not best[1]:
        raise SystemExit(f"no gridtnp fit rate of the station task on a {device} in {results}")
    return best
