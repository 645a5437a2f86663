"""``gridtnp data prepare``'s memory does not grow with the number of input files (netCDF's per-variable chunk
cache is limited, the data is written block by block): peak RSS of a subprocess preparing 50 files against 20."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.data.inputs import NETCDF_CHUNK_CACHE

ROOT = Path(__file__).resolve().parents[2]
PEAK = """
import json, resource, sys
from gridtnp.data import prepare as module
module.NETCDF_CHUNK_CACHE = int(sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
module.prepare(sys.argv[4:], sys.argv[1], progress=False, time_chunk=int(sys.argv[3]), block_steps=96)
print(json.dumps({"base_mb": base / 1024, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def daily_files(folder: Path, count: int) -> list[str]:
    """``count`` files of 24 hours on a 1 degree global grid, zlib-compressed, one 6.2 MB chunk per file."""
    lat, lon = np.arange(-90.0, 90.5, 1.0), np.arange(0.0, 360.0, 1.0)
    rng = np.random.default_rng(0)
    field = (250 + 40 * np.cos(np.deg2rad(lat))[:, None] + rng.normal(size=(len(lat), len(lon)))).astype(np.float32)
    paths = []
    for day in range(count):
        time_axis = pd.date_range("2020-01-01", periods=24, freq="h") + pd.Timedelta(days=day)
        values = np.broadcast_to(field, (24, *field.shape)) + np.arange(24, dtype=np.float32)[:, None, None]
        ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), values)}, coords={"time": time_axis,
                        "latitude": lat, "longitude": lon})  # fmt: skip
        path = folder / f"day{day:02d}.nc"
        ds.to_netcdf(path, encoding={"t2m": {"zlib": True, "complevel": 1, "chunksizes": (24, len(lat), len(lon))}})
        paths.append(str(path))
    return paths


def peak(out: Path, files: list[str], cache: int, time_chunk: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", PEAK, str(out), str(cache), str(time_chunk), *files]
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # six subprocesses importing gridtnp and 300 MB of data: about half a minute on 2 cores
def test_fifty_input_files_stay_under_the_memory_bound(tmp_path: Path) -> None:
    files = daily_files(tmp_path, 50)

    def growth(cache: int, time_chunk: int) -> float:
        few = peak(tmp_path / f"few{cache}_{time_chunk}.zarr", files[:20], cache, time_chunk)
        many = peak(tmp_path / f"many{cache}_{time_chunk}.zarr", files, cache, time_chunk)
        return (many["peak_mb"] - many["base_mb"]) - (few["peak_mb"] - few["base_mb"])

    assert growth(NETCDF_CHUNK_CACHE, 24) < 100  # each stored chunk read whole: HDF5 skips the chunk cache
    assert growth(NETCDF_CHUNK_CACHE, 12) < 100  # half chunks go through the cache, which the limit bounds
    # netCDF's default chunk cache (64 MiB a variable) keeps each file's decompressed 6.2 MB chunk: 30 more files
    # hold 190 MB more.
    default = growth(64 * 2**20, 12)
    assert default > 150, default
