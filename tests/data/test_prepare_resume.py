"""``gridtnp data prepare`` killed with SIGKILL and rerun: it resumes after its last checkpoint without rewriting
the blocks before it, and gives the store an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.data.climatology import CLIMATOLOGY_ATTR, CLIMATOLOGY_GROUP
from gridtnp.data.layout import STATS_ATTR
from gridtnp.data.prepare.pipeline import partial_path, prepare
from gridtnp.data.prepare.writer import STATE

ROOT = Path(__file__).resolve().parents[2]
HOURS = 60


def source(path: Path) -> Path:
    time_axis = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    rng = np.random.default_rng(3)
    values = rng.normal(280.0, 5.0, size=(HOURS, 6, 8)).astype(np.float32)
    values[7, 2, 3] = np.nan
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), values, {"units": "K"})},
        coords={"time": time_axis, "lat": np.arange(6.0), "lon": np.arange(8.0)},
    )
    ds.to_netcdf(path)
    return path


ARGS = {"time_chunk": 1, "block_steps": 1, "checkpoint_s": 0.0, "climatology": True, "train_end": "2020-01-02"}


def same_store(a: Path, b: Path) -> None:
    x, y = xr.open_zarr(a), xr.open_zarr(b)
    xr.testing.assert_identical(x.drop_attrs(), y.drop_attrs())
    assert x.attrs[STATS_ATTR] == y.attrs[STATS_ATTR] and x.attrs[CLIMATOLOGY_ATTR] == y.attrs[CLIMATOLOGY_ATTR]
    cx, cy = (xr.open_zarr(p, group=CLIMATOLOGY_GROUP) for p in (a, b))
    xr.testing.assert_identical(cx, cy)
    for chunk in sorted(p.name for p in (a / "t2m").iterdir() if not p.name.startswith(".")):
        assert (a / "t2m" / chunk).read_bytes() == (b / "t2m" / chunk).read_bytes()


KILLER = """
import os, signal
from gridtnp.data.prepare import writer
from gridtnp.data.prepare import prepare
save = writer.save_state
def save_then_die(store, fingerprint, done, *rest):
    save(store, fingerprint, done, *rest)
    if done == {kill_after}:
        os.kill(os.getpid(), signal.SIGKILL)
writer.save_state = save_then_die
prepare([{nc!r}], {out!r}, progress=False, **{args!r})
"""


@pytest.mark.slow  # a subprocess importing gridtnp: about 20 s on 2 shared cores
def test_a_killed_prepare_resumes_without_rewriting_finished_blocks(tmp_path: Path, capsys) -> None:
    nc = source(tmp_path / "src.nc")
    out = tmp_path / "killed.zarr"
    code = KILLER.format(kill_after=20, nc=str(nc), out=str(out), args=ARGS)
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and partial_path(out).is_dir()
    done = json.loads((partial_path(out) / STATE).read_text())["done"]
    assert done == 20
    chunks = {p.name: p.stat().st_mtime_ns for p in (partial_path(out) / "t2m").iterdir() if p.name[0] != "."}
    finished = {k: v for k, v in chunks.items() if int(k.split(".")[0]) < done}
    assert len(finished) == done
    capsys.readouterr()
    prepare([nc], out, progress=True, **ARGS)
    assert f"resuming after {done} of {HOURS} blocks" in capsys.readouterr().out
    for name, mtime in finished.items():
        assert (out / "t2m" / name).stat().st_mtime_ns == mtime  # not rewritten
    assert not (out / STATE).exists() and not partial_path(out).exists()
    same_store(out, prepare([nc], tmp_path / "whole.zarr", progress=False, **{**ARGS, "checkpoint_s": 60.0}))
