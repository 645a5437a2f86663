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

from gridtnp.data.prepare.inputs import NETCDF_CHUNK_CACHE

ROOT = Path(__file__).resolve().parents[2]
# VmHWM, not getrusage's ru_maxrss: the latter keeps the high-water mark of the parent (pytest) across fork and exec.
PEAK = """
import json, sys
from gridtnp.data.prepare import pipeline as module
from gridtnp.data.freed_memory import keep_freed_memory

keep_freed_memory()  # as the command does

def mb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

module.NETCDF_CHUNK_CACHE = int(sys.argv[2])
base = mb("VmRSS:")
steps, block, region = sys.argv[3].split(",", 2)
module.prepare(sys.argv[4:], sys.argv[1], progress=False, time_chunk=int(steps), block_steps=int(block),
               region=region or None)
print(json.dumps({"base_mb": base, "peak_mb": mb("VmHWM:")}))
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


def peak(out: Path, files: list[str], cache: int, time_chunk: int, block: int, region: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRIDTNP_KEEP_FREED_MEMORY", None)
    args = [sys.executable, "-c", PEAK, str(out), str(cache), f"{time_chunk},{block},{region}", *files]
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory from Linux's /proc")
@pytest.mark.slow  # six subprocesses importing gridtnp and 300 MB of data: about half a minute on 2 cores
def test_fifty_input_files_stay_under_the_memory_bound(tmp_path: Path) -> None:
    files = daily_files(tmp_path, 50)

    def growth(cache: int, time_chunk: int, block: int, region: str = "") -> float:
        name = f"{cache}_{time_chunk}_{bool(region)}.zarr"
        few = peak(tmp_path / f"few{name}", files[:20], cache, time_chunk, block, region)
        many = peak(tmp_path / f"many{name}", files, cache, time_chunk, block, region)
        return (many["peak_mb"] - many["base_mb"]) - (few["peak_mb"] - few["base_mb"])

    # Each file's 24-step chunk read whole (blocks of 96 steps): HDF5 reads it past the chunk cache.
    assert growth(NETCDF_CHUNK_CACHE, 24, 96) < 100
    # A region and blocks of 12 steps read parts of chunks, through the chunk cache, which the limit bounds.
    tropics = "-45,45,-180,180"
    assert growth(NETCDF_CHUNK_CACHE, 12, 12, tropics) < 100
    # netCDF's default chunk cache (64 MiB a variable) keeps each file's decompressed 6.2 MB chunk: 30 more files
    # hold 190 MB more.
    default = growth(64 * 2**20, 12, 12, tropics)
    assert default > 150, default
