"""Data-loading throughput of the ERA5 DataModules: tasks per second with 0 and N DataLoader workers.

    python benchmarks/data_loading.py --small                     # minutes on a laptop CPU
    python benchmarks/data_loading.py --workers 0 2 4 --days 14   # global 0.25 degree store, 14 days (1.4 GB)

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
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import command_line, device_name, git_commit, write_table  # noqa: E402

from gridtnp.data import MultiSourceDataModule, StationReanalysisDataModule  # noqa: E402
from gridtnp.data.layout import PROVENANCE_ATTR, STATS_ATTR  # noqa: E402
from gridtnp.data.prepare import auto_time_chunk  # noqa: E402


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
    """Iterate a fresh DataModule's training loader: time to the first batch, then tasks per second."""
    dm = make(workers)
    dm.setup()
    start = time.perf_counter()
    loader = iter(dm.train_dataloader())
    first = next(loader)
    t_first = time.perf_counter()
    count, points = 0, 0
    for batch in loader:
        count += batch.batch_size
        points += int(batch.target.mask.sum()) + sum(int(o.mask.sum()) for o in batch.context.values())
    elapsed = time.perf_counter() - t_first
    return {
        "first_batch_s": t_first - start,
        "tasks_per_s": count / elapsed,
        "batches_per_s": (batches - 1) / elapsed,
        "points_per_task": points / max(count, 1),
        "batch_size": first.batch_size,
    }


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
    args = p.parse_args()
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
        "sample / era5_stations": lambda w: StationReanalysisDataModule(num_workers=w, **common),
        "sample / era5_multisource (window 4)": lambda w: MultiSourceDataModule(num_workers=w, window=4, **common),
        f"global {args.resolution:g} deg / era5_stations (distinct HadISD points)": lambda w: (
            StationReanalysisDataModule(
                store=str(store), coarsen=coarsen, num_workers=w, cache_chunks=2, **glob_dates, **common
            )
        ),
        f"global {args.resolution:g} deg / era5_multisource Europe (window 4)": lambda w: MultiSourceDataModule(
            store=str(store), region=(35.0, 70.0, -15.0, 40.0), num_workers=w, cache_chunks=2, **glob_dates, **common
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
        "batches": f"batch size {b}, {n} batches per measurement; throughput excludes the first batch (start-up)",
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
