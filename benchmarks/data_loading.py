"""Data-loading throughput of the ERA5 DataModules: tasks per second with 0 and N DataLoader workers.

    python benchmarks/data_loading.py --small                     # minutes on a laptop CPU
    python benchmarks/data_loading.py --workers 0 2 4 --days 14   # global 0.25 degree store, 14 days (1.4 GB)
    python benchmarks/data_loading.py --scale --hours 48          # prepare + loaders at the paper's scale
    python benchmarks/data_loading.py --scale --hours 48 --skip-prepare --storage  # bytes per task, 32 GPUs

Cases:

* ``sample``: the embedded ERA5 sample (British Isles, 33 x 49 points), station + reanalysis task of
  ``recipes/era5_swin.yaml`` and the multi-source task of ``recipes/era5_multisource_swin.yaml``;
* ``global``: a synthetic store shaped like ERA5 (one float32 variable, hourly, global ``--resolution`` degrees,
  ``--days`` days, written once into ``--store-dir`` in gridtnp's prepared layout with automatic time chunks),
  station task with the 9,159 distinct HadISD station points and the grid coarsened to 1 degree, and a multi-source
  task over Europe (35-70 N, 15 W-40 E, windows of 4 hours). One year of global 0.25 degree hourly data is 36 GB per
  variable; a random task reads one time chunk of the full grid whatever the span, so a shorter span measures the
  same per-task cost (with a small chunk cache, as a year-long store would see few cache hits).

Each case iterates the training DataLoader for ``--batches`` batches; the first batch (worker start, store
opening) is timed separately and throughput is over the rest. Results go to a Markdown table and a CSV.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import command_line, device_name, git_commit, repo_env, write_table  # noqa: E402

from gridtnp.data import MultiSourceDataModule, StationReanalysisDataModule  # noqa: E402
from gridtnp.data.layout import PROVENANCE_ATTR, STATS_ATTR  # noqa: E402
from gridtnp.data.prepare.inputs import auto_time_chunk  # noqa: E402
from gridtnp.data.sections import from_flat_arguments  # noqa: E402


def synthetic_store(directory: Path, resolution: float, days: int) -> Path:
    """A prepared-layout store ``t2m [hours, lat, lon]``: a smooth field plus noise (incompressible, like real data)."""
    import dask.array as da
    import xarray as xr

    path = directory / f"synthetic_global_{resolution:g}deg_{days}d.zarr"
    if path.exists():
        return path
    lat = np.arange(-90.0, 90.0 + resolution / 2, resolution)
    lon = np.arange(-180.0, 180.0, resolution)
    time_axis = pd.date_range("2019-01-01", periods=24 * days, freq="h")
    shape = (len(time_axis), len(lat), len(lon))
    probe = xr.Dataset({"t2m": (("time", "latitude", "longitude"), da.zeros(shape, dtype=np.float32, chunks=-1))})
    steps = auto_time_chunk(probe)

    def block(block_info: dict | None = None) -> np.ndarray:
        (t0, t1), (a0, a1), (o0, o1) = block_info[None]["array-location"]
        rng = np.random.default_rng(t0)
        la = np.deg2rad(lat[a0:a1])[None, :, None]
        hours = np.arange(t0, t1)[:, None, None]
        smooth = 250.0 + 30.0 * np.cos(la) + 5.0 * np.sin(2 * np.pi * hours / 24.0 + np.deg2rad(lon[o0:o1]))
        return (smooth + rng.standard_normal((t1 - t0, a1 - a0, o1 - o0))).astype(np.float32)

    chunks = da.core.normalize_chunks((steps, len(lat), len(lon)), shape)
    values = da.map_blocks(block, dtype=np.float32, chunks=chunks, meta=np.array((), np.float32))
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), values, {"units": "K", "long_name": "synthetic 2 m temperature"})},
        coords={"time": time_axis, "latitude": lat, "longitude": lon},
    )
    ds.attrs[STATS_ATTR] = {"t2m": {"mean": 270.0, "std": 20.0}}
    ds.attrs[PROVENANCE_ATTR] = {"created_by": "benchmarks/data_loading.py (synthetic)"}
    gib = np.prod(shape) * 4 / 2**30
    print(f"writing {path} ({' x '.join(map(str, shape))} float32, {gib:.2f} GiB, {steps} steps per chunk)...")
    start = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    ds.to_zarr(tmp, mode="w", zarr_format=2, consolidated=True)
    tmp.rename(path)
    print(f"  written in {time.perf_counter() - start:.0f} s")
    return path


def measure(make, workers: int, batches: int) -> dict[str, float]:
    """Iterate a fresh DataModule's training loader: time to the first batch, then tasks per second after each
    worker's first batch (as ``loader_rate``)."""
    dm = make(workers)
    dm.setup()
    start = time.perf_counter()
    loader = iter(dm.train_dataloader())
    first = next(loader)
    first_s = time.perf_counter() - start
    for _ in range(workers - 1):
        next(loader)
    t_first = time.perf_counter()
    count, points = 0, 0
    for batch in loader:
        count += batch.batch_size
        points += int(batch.target.mask.sum()) + sum(int(o.mask.sum()) for o in batch.context.values())
    elapsed = time.perf_counter() - t_first
    return {
        "first_batch_s": first_s,
        "tasks_per_s": count / elapsed,
        "batches_per_s": count / first.batch_size / elapsed,
        "points_per_task": points / max(count, 1),
        "batch_size": first.batch_size,
    }


# ------------------------------------------------------------------------------------------ at the paper's scale
# `--scale`: the global store built by `gridtnp data prepare` from daily NetCDF files, prepare timed, the loader of
# recipes/era5_swin_global.yaml (station task) and of a multi-source task measured in tasks per CPU second, with 0
# and N DataLoader workers, from the local store and from the same store over HTTP with added latency.


def daily_files(folder: Path, hours: int, jobs: int = 1) -> list[Path]:
    """``hours`` hours of global 0.25 degree t2m and skt as daily NetCDF files (zlib level 1, a chunk per step):
    a latitude profile, a diurnal cycle following the sun, weather-like smooth anomalies and grid-scale noise.
    Each day has its own seed, so files written by ``jobs`` processes, or kept from an earlier run, are the same."""
    folder.mkdir(parents=True, exist_ok=True)
    days = -(-hours // 24)
    paths = [folder / f"era5_global_{day:03d}.nc" for day in range(days)]
    todo = [(paths[day], day, min(24, hours - 24 * day)) for day in range(days) if not paths[day].exists()]
    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
            list(pool.map(_daily_file, *zip(*todo, strict=True)))
    else:
        for item in todo:
            _daily_file(*item)
    return paths


def _daily_file(path: Path, day: int, steps: int) -> None:
    """Day ``day`` (from 2019-01-01) of ``daily_files``: ``steps`` hourly steps written to ``path``."""
    import xarray as xr

    lat = np.arange(90.0, -90.01, -0.25)  # descending and 0-360, as ERA5 downloads are
    lon = np.arange(0.0, 360.0, 0.25)
    base = 250.0 + 45.0 * np.cos(np.deg2rad(lat))[:, None] + 0.0 * lon[None, :]
    coarse = np.random.default_rng(0).normal(size=(24, 46, 91))  # anomalies on 4 degree blocks, by hour
    rng = np.random.default_rng([0, day])
    time_axis = pd.date_range("2019-01-01", periods=steps, freq="h") + pd.Timedelta(days=day)
    t2m = np.empty((steps, len(lat), len(lon)), np.float32)
    for h in range(steps):
        hour = 24 * day + h
        weights = np.cos(np.deg2rad(lon[None, :] + 15.0 * hour - 180.0)).clip(0) * np.cos(np.deg2rad(lat))[:, None]
        anomaly = np.kron(coarse[hour % 24] + 0.1 * day, np.ones((16, 16)))[: len(lat), : len(lon)]
        noise = rng.standard_normal((len(lat), len(lon)), dtype=np.float32)
        t2m[h] = base + 8.0 * weights + 3.0 * anomaly + 0.5 * noise
    skt = t2m + 2.0 * rng.standard_normal(t2m.shape, dtype=np.float32)
    ds = xr.Dataset(
        {
            "t2m": (("time", "latitude", "longitude"), t2m, {"units": "K", "long_name": "2 metre temperature"}),
            "skt": (("time", "latitude", "longitude"), skt, {"units": "K", "long_name": "Skin temperature"}),
        },
        coords={"time": time_axis, "latitude": lat, "longitude": lon},
    )
    enc = {"zlib": True, "complevel": 1, "chunksizes": (1, len(lat), len(lon))}
    tmp = path.with_name(path.name + ".tmp")
    ds.to_netcdf(tmp, encoding={"t2m": enc, "skt": enc})
    tmp.rename(path)  # an interrupted run leaves no truncated file under the name reused next time
    print(f"wrote {path}", flush=True)


def timed_prepare(files: list[Path], out: Path, train_end: str) -> dict[str, float]:
    """``gridtnp data prepare`` in a subprocess: wall time, CPU time, peak memory, MB/s of float32 written (CPU time
    and peak memory of that process alone, from ``os.wait4``: ``RUSAGE_CHILDREN`` keeps the largest child's peak)."""
    import shutil
    import subprocess
    import tempfile

    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "gridtnp.cli", "data", "prepare", *map(str, files), "--out", str(out),
            "--train-end", train_end, "--climatology"]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(args, env=repo_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    print(output)
    if proc.returncode != 0:
        raise SystemExit(f"gridtnp data prepare failed (exit {proc.returncode})")
    rates = [line for line in output.splitlines() if "MB/s" in line]  # the writer's own rate, start-up excluded
    writer_rate = float(rates[-1].split(" MB/s")[0].rsplit(" ", 1)[-1]) if rates else float("nan")
    nbytes = _float32_bytes(out)
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "mb_per_s": nbytes / 1e6 / wall,
        "writer_mb_per_s": writer_rate,
    }


def _float32_bytes(store: Path) -> int:
    import xarray as xr

    ds = xr.open_zarr(store)
    return sum(4 * int(np.prod(v.shape)) for v in ds.data_vars.values())


def loader_rate(make, workers: int, batches: int) -> dict[str, float]:
    """Tasks per wall second and per CPU second (this process and its workers) of a fresh training loader,
    excluding the first batch of each worker: start-up, and workers that started together finish their first
    batches together (timing from the first one would count the others' head start)."""
    dm = make(workers)
    dm.setup()
    loader = iter(dm.train_dataloader())
    skipped = max(1, workers)
    for _ in range(skipped):
        first = next(loader)
    cpu0 = _cpu_now()
    start = time.perf_counter()
    count = 0
    for batch in loader:
        count += batch.batch_size
    wall = time.perf_counter() - start
    del loader
    import gc

    gc.collect()
    time.sleep(0.5)  # workers exit: their CPU time is then in RUSAGE_CHILDREN
    cpu = _cpu_now() - cpu0
    return {
        "tasks_per_s": count / wall,
        "tasks_per_cpu_s": count / max(cpu, 1e-9),
        "batch": first.batch_size,
        "timed": count // first.batch_size,
    }


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def scale_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))  # the test tools: a folder served over HTTP with added latency
    from tests.http_server import LocalHTTPServer

    days = -(-args.hours // 24)
    files = daily_files(args.store_dir / "raw", args.hours)
    store = args.store_dir / f"era5_global_{args.hours}h.zarr"
    if days < 2:
        raise SystemExit("--scale needs --hours >= 48: training days, then a day split into validation and test")
    train_end = f"2019-01-{days - 1:02d}"
    last = f"2019-01-{days:02d}"
    rows = []
    if args.skip_prepare and store.exists():
        print(f"using {store}")
    else:
        runs = [timed_prepare(files, store, train_end) for _ in range(args.repeat)]
        for run in runs:
            print(f"prepare: {run}")
        p = {k: float(np.median([run[k] for run in runs])) for k in runs[0]}
        p["peak_mb"] = max(run["peak_mb"] for run in runs)
        rates = sorted(run["mb_per_s"] for run in runs)
        spread = f"; median of {len(runs)} runs, {rates[0]:.0f} to {rates[-1]:.0f} MB/s" if len(runs) > 1 else ""
        rows.append(
            {
                "case": f"gridtnp data prepare, {len(files)} daily files (t2m, skt; --climatology)",
                "workers": "-",
                "tasks/s (wall)": "-",
                "tasks/s per CPU s": "-",
                "notes": f"wall {p['wall_s']:.0f} s (start-up included), CPU {p['cpu_s']:.0f} s, peak "
                f"{p['peak_mb']:.0f} MB (the highest run), {p['mb_per_s']:.0f} MB/s of float32 over the wall time, "
                f"{p['writer_mb_per_s']:.0f} MB/s while writing{spread}",
            }
        )
    dates = {
        "train_dates": ("2019-01-01", train_end),
        "val_dates": (f"{last}T00", f"{last}T11"),
        "test_dates": (f"{last}T12", f"{last}T23"),
    }
    common = {"batch_size": 16, "train_batches": args.batches, "cache_chunks": 2, **dates}
    station = {"stations": None, "unique_grid_points": True, "station_variable": "t2m", "grid_variables": ["skt"],
               "coarsen": 4, "context_fraction": (0.0, 0.3), "targets": "held_out"}  # fmt: skip
    if args.side_by_side:  # what the cores give: one loader, two workers, two independent loaders at once
        rows += cores_rows(str(store), station, common, args.batches, args.repeat)
        write_scale_table(args, rows)
        return
    if args.storage:  # bytes per task and what 32 GPUs need (benchmarks/storage_rate.py)
        from storage_rate import recorded_station_rate, storage_rows, table2_cpu_rows

        rate, source = recorded_station_rate(ROOT / "benchmarks" / "results")
        print(f"station task on one H200: {rate} tasks/s ({source}); multi-source: {args.multisource_gpu_rate} (given)")
        rates = {"station": rate, "multisource": args.multisource_gpu_rate}
        rows += storage_rows(str(store), station, common, args.store_dir, rates, args.tasks_per_read, args.batches)
        rows += table2_cpu_rows(args.store_dir, args.batches, args.repeat)
        write_scale_table(args, rows)
        return
    with LocalHTTPServer(store.parent, latency=args.latency) as server:
        sources = {"local": str(store), f"HTTP +{1000 * args.latency:.0f} ms": server.url(store.name)}
        for where, path in sources.items():
            cases = {
                "station task (era5_swin_global.yaml data)": lambda w, path=path: from_flat_arguments(
                    StationReanalysisDataModule, store=path, num_workers=w, climatology=False, **station, **common
                ),
                "multi-source Europe, window 4 (t2m, skt)": lambda w, path=path: from_flat_arguments(
                    MultiSourceDataModule,
                    store=path,
                    variables=["t2m", "skt"],
                    region=(35.0, 70.0, -15.0, 40.0),
                    window=4,
                    num_workers=w,
                    **common,
                ),
            }
            for name, make in cases.items():
                for workers in args.workers:
                    runs = [loader_rate(make, workers, args.batches) for _ in range(args.repeat)]
                    r = {k: float(np.median([run[k] for run in runs])) for k in ("tasks_per_s", "tasks_per_cpu_s")}
                    print(f"{where:<14} {name:<45} workers {workers}: {r['tasks_per_s']:6.1f} tasks/s, "
                          f"{r['tasks_per_cpu_s']:6.1f} per CPU s")  # fmt: skip
                    spread = ""
                    if args.repeat > 1:
                        rates = sorted(run["tasks_per_s"] for run in runs)
                        spread = f"; median of {args.repeat} runs, {rates[0]:.1f} to {rates[-1]:.1f} tasks/s"
                    rows.append(
                        {
                            "case": f"{where}: {name}",
                            "workers": workers,
                            "tasks/s (wall)": f"{r['tasks_per_s']:.1f}",
                            "tasks/s per CPU s": f"{r['tasks_per_cpu_s']:.1f}",
                            "notes": f"batch {runs[0]['batch']}, {runs[0]['timed']} batches timed{spread}",
                        }
                    )
    for row in gpu_rows(rows):
        print(row["case"], row["tasks/s (wall)"], row["notes"])
        rows.append(row)
    write_scale_table(args, rows)


def gpu_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What one GPU consumes of the station task (the highest ``gridtnp fit (consumed)`` rate per device recorded in
    ``benchmarks/results/gpu_training_global_*.csv``) against the cores that feed it: of this machine, at the
    station task's rates in ``rows`` (tasks per CPU second), and of the GPU's own host, at its DataLoader's."""
    import csv
    import re

    consumed: dict[str, tuple[float, str]] = {}
    host: dict[str, list[tuple[int, float]]] = {}  # device -> [(workers, tasks per CPU s)] of its DataLoader alone
    for path in sorted((ROOT / "benchmarks" / "results").glob("gpu_training_global_*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rate = float(row["tasks/s"]) if row["tasks/s"] not in ("", "-") else 0.0
                if row["measure"].startswith("gridtnp fit") and rate > consumed.get(row["device"], (0.0, ""))[0]:
                    consumed[row["device"]] = (rate, path.name)
                per_cpu = re.search(r"([\d.]+) tasks per CPU s", row["notes"])
                if row["measure"].startswith("training DataLoader") and per_cpu:
                    host.setdefault(row["device"], []).append((int(row["workers"]), float(per_cpu.group(1))))
    station = [r for r in rows if "station task" in r["case"] and r["workers"] != "-"]
    out = []
    for device, (rate, name) in consumed.items():
        here = "; ".join(
            f"{r['case'].split(':')[0]} with {r['workers']} workers: {rate / float(r['tasks/s per CPU s']):.1f}"
            for r in station
        )
        by_workers: dict[int, list[float]] = {}
        for w, per_cpu in host.get(device, []):
            by_workers.setdefault(w, []).append(rate / per_cpu)
        there = "; ".join(
            f"{w} workers: " + (f"{min(n):.1f}" if len(set(n)) == 1 else f"{min(n):.1f} to {max(n):.1f}")
            for w, n in sorted(by_workers.items())
        )
        out.append(
            {
                "case": f"one {device} consumes: era5_swin_global, bf16-mixed ({name})",
                "workers": "-",
                "tasks/s (wall)": f"{rate:.1f}",
                "tasks/s per CPU s": "-",
                "notes": f"cores that feed it, of this machine at the station task's rates above: {here}"
                + (f"; of its own host, at its DataLoader's rate alone: {there}" if there else ""),
            }
        )
    return out


def _station_rate(store: str, station: dict[str, Any], common: dict[str, Any], workers: int, batches: int) -> float:
    """Tasks per second of the station task's training loader on ``store`` (a fresh DataModule)."""
    make = lambda w: from_flat_arguments(  # noqa: E731
        StationReanalysisDataModule, store=store, num_workers=w, climatology=False, **station, **common
    )
    return loader_rate(make, workers, batches)["tasks_per_s"]


def cores_rows(
    store: str, station: dict[str, Any], common: dict[str, Any], batches: int, repeat: int
) -> list[dict[str, str]]:
    """The station task with 0 and 2 workers beside two 0-worker loaders run at once in two processes: whether
    two workers fall short of twice one process because of the loader or because two busy cores are each slower."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    rows = []
    for name, workers in (("one process (0 workers)", 0), ("2 DataLoader workers", 2)):
        rates = sorted(_station_rate(store, station, common, workers, batches) for _ in range(repeat))
        rows.append(_cores_row(name, rates))
        print(rows[-1], flush=True)
    totals = []
    for _ in range(repeat):  # fresh interpreters (spawn): a fork would inherit this process's store threads
        with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
            runs = [pool.submit(_station_rate, store, station, common, 0, batches) for _ in range(2)]
            totals.append(sum(run.result() for run in runs))
    rows.append(_cores_row("two 0-worker loaders in two processes at once (the sum)", sorted(totals)))
    print(rows[-1], flush=True)
    rows += _spin_rows(repeat)
    return rows


def _spin(iterations: int = 20_000_000) -> float:
    """Millions of iterations per second of a pure-Python loop: work that touches neither memory nor disk."""
    start, total = time.perf_counter(), 0
    for i in range(iterations):
        total += i
    return iterations / 1e6 / (time.perf_counter() - start)


def _stream(rounds: int = 60) -> float:
    """GB/s of copying a 64 MiB float32 array into another (bytes read plus written): work bound by memory, as
    the loader's chunk copies and block sums are."""
    src = np.ones(16 * 2**20, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for _ in range(rounds):
        np.copyto(dst, src)
    return rounds * 2 * src.nbytes / 1e9 / (time.perf_counter() - start)


def _spin_rows(repeat: int) -> list[dict[str, str]]:
    """The machine's own yardsticks, each in one process against two run at once in two processes: a pure-Python
    loop (the cores alone) and a copy of large arrays (the cores and their memory)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    rows = []
    yardsticks = ((_spin, "pure-Python loop", "M loop iterations/s"), (_stream, "64 MiB array copy", "GB/s"))
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for warm in [pool.submit(_spin, 1000) for _ in range(2)]:  # two interpreters started before any timing
            warm.result()
        for work, label, unit in yardsticks:
            one, two = [], []
            for _ in range(repeat):
                one.append(pool.submit(work).result())
                runs = [pool.submit(work) for _ in range(2)]
                two.append(sum(run.result() for run in runs))
            for name, rates in (("one process", one), ("two processes at once (the sum)", two)):
                median = float(np.median(rates))
                notes = f"{unit}; median of {len(rates)} runs, {min(rates):.1f} to {max(rates):.1f}"
                rows.append({"case": f"{label}, {name}", "workers": "-", "tasks/s (wall)": f"{median:.1f}",
                             "tasks/s per CPU s": "-", "notes": notes})  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def _cores_row(name: str, rates: list[float]) -> dict[str, str]:
    median = float(np.median(rates))
    notes = f"median of {len(rates)} runs, {rates[0]:.1f} to {rates[-1]:.1f} tasks/s"
    return {"case": f"local: station task, {name}", "workers": "-", "tasks/s (wall)": f"{median:.1f}",
            "tasks/s per CPU s": "-", "notes": notes}  # fmt: skip


def write_scale_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The ``--scale`` table (Markdown and CSV) with the run's record."""
    meta = {
        "torch": torch.__version__,
        "commit": git_commit(),
        "device": device_name(torch.device("cpu")),
        "cores": str(os.cpu_count()),
        "load": ", ".join(f"{v:.1f}" for v in os.getloadavg()),
        "command": f"`python benchmarks/data_loading.py {' '.join(sys.argv[1:])}`",
        "store": f"global 0.25 degree t2m + skt, {args.hours} hours, prepared by gridtnp data prepare from daily "
        "NetCDF files (synthetic fields: latitude profile, diurnal cycle, smooth anomalies, noise)",
        "per CPU s": "tasks over the CPU seconds of the loading process and its workers (a shared machine's wall "
        "rate understates what the cores give)",
    }
    title = "Data at scale: prepare and training-loader throughput (global 0.25 degree)"
    for path in write_table(args.out.with_name(args.out.name + "_scale").with_suffix(".md"), title, meta, rows):
        print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="1 degree global store of 7 days, fewer batches")
    p.add_argument("--resolution", type=float, default=0.25, help="global store resolution in degrees (0.25)")
    p.add_argument("--days", type=int, default=7, help="days in the global store (7: 168 hours)")
    p.add_argument("--store-dir", type=Path, default=Path("runs/benchmark_data"), help="where the store is written")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader worker counts (0 2)")
    p.add_argument("--batches", type=int, default=40, help="batches per measurement (40)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "data_loading_cpu")
    p.add_argument("--scale", action="store_true", help="the paper-scale run: prepare timed, station and multi-source")
    p.add_argument("--hours", type=int, default=48, help="--scale: hours of global data (48; the paper: years)")
    p.add_argument("--latency", type=float, default=0.05, help="--scale: added latency of the HTTP store (0.05 s)")
    p.add_argument("--skip-prepare", action="store_true", help="--scale: reuse the prepared store if present")
    p.add_argument("--repeat", type=int, default=1, help="--scale: runs of prepare and of each loader, the median (1)")
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="--scale: only the local station task, 0 and 2 workers beside two loaders in two processes at once",
    )
    p.add_argument("--storage", action="store_true", help="--scale: bytes per task, the 32-GPU storage rate")
    p.add_argument("--tasks-per-read", type=int, nargs="+", default=[1, 4], help="--storage: values compared (1 4)")
    p.add_argument("--multisource-gpu-rate", type=float, default=80.0, help="--storage: tasks/s per GPU assumed")
    args = p.parse_args()
    if args.scale:
        args.store_dir.mkdir(parents=True, exist_ok=True)
        scale_main(args)
        return
    if args.small:
        args.resolution, args.days, args.batches = 1.0, 7, 20
    args.store_dir.mkdir(parents=True, exist_ok=True)
    store = synthetic_store(args.store_dir, args.resolution, args.days)
    b, n = args.batch_size, args.batches
    common = {"batch_size": b, "train_batches": n}
    glob_dates = {
        "train_dates": ("2019-01-01", f"2019-01-{args.days - 2:02d}"),
        "val_dates": (f"2019-01-{args.days - 1:02d}",) * 2,
        "test_dates": (f"2019-01-{args.days:02d}",) * 2,
    }
    coarsen = max(1, round(1.0 / args.resolution))
    cases = {
        "sample / era5_stations": lambda w: from_flat_arguments(StationReanalysisDataModule, num_workers=w, **common),
        "sample / era5_multisource (window 4)": lambda w: from_flat_arguments(
            MultiSourceDataModule, num_workers=w, window=4, **common
        ),
        f"global {args.resolution:g} deg / era5_stations (distinct HadISD points)": lambda w: from_flat_arguments(
            StationReanalysisDataModule,
            store=str(store),
            coarsen=coarsen,
            num_workers=w,
            cache_chunks=2,
            **glob_dates,
            **common,
        ),
        f"global {args.resolution:g} deg / era5_multisource Europe (window 4)": lambda w: from_flat_arguments(
            MultiSourceDataModule,
            store=str(store),
            region=(35.0, 70.0, -15.0, 40.0),
            num_workers=w,
            cache_chunks=2,
            **glob_dates,
            **common,
        ),
    }
    rows = []
    for name, make in cases.items():
        for workers in args.workers:
            result = measure(make, workers, n)
            rows.append({"case": name, "workers": workers, **result})
            print(
                f"{name:<55} workers {workers}: {result['tasks_per_s']:8.1f} tasks/s "
                f"(first batch {result['first_batch_s']:.2f} s, {result['points_per_task']:,.0f} points/task)"
            )

    n_lat, n_lon = round(180 / args.resolution) + 1, round(360 / args.resolution)
    meta = {
        "commit": git_commit(),
        "torch": torch.__version__,
        "device": device_name(torch.device("cpu")),
        "command": f"`{command_line()}`",
        "global store": f"synthetic, 1 float32 variable, {24 * args.days} x {n_lat} x {n_lon} (hours x lat x lon), "
        "written locally (a shorter span than a year: per-task cost is one time chunk of the full grid either way); "
        "chunk cache 2",
        "batches": f"batch size {b}, {n} batches per measurement; throughput excludes each worker's first batch "
        "(start-up)",
    }
    table = [
        {
            "case": r["case"],
            "workers": r["workers"],
            "tasks/s": f"{r['tasks_per_s']:.1f}",
            "batches/s": f"{r['batches_per_s']:.2f}",
            "first batch (s)": f"{r['first_batch_s']:.2f}",
            "points per task": round(r["points_per_task"]),
        }
        for r in rows
    ]
    title = "Data-loading throughput (training DataLoader, tasks per second)"
    for path in write_table(args.out.with_suffix(".md"), title, meta, table):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
