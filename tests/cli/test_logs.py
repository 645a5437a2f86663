"""Quiet, continuous logs: a short fit prints no Python warning and, without a terminal, plain progress lines;
``gridtnp test`` prints one metric table; leftovers of killed checkpoint writes are cleaned."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

from gridtnp import NeuralProcessModule

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "gp1d_tnp.yaml")
WARNING_LINE = re.compile(r"\.py:\d+: |Warning:|warn", re.IGNORECASE)


def gridtnp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gridtnp.cli", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def test_a_short_fit_and_test_print_no_warning_and_one_table(tmp_path):
    common = ["--config", RECIPE, "--data.init_args.loader.val_batches", "1",
              "--data.init_args.loader.test_batches", "1",
              "--model.init_args.dim", "16"]  # fmt: skip
    leftover = tmp_path / "ckpt" / ".last.ckpt.tmp-deadbeef"  # a write killed before its rename, earlier
    leftover.parent.mkdir()
    leftover.write_bytes(b"partial")
    fit = gridtnp("fit", *common, "--trainer.max_steps", "6", "--trainer.val_check_interval", "3",
                  "--progress.every_n_steps", "3", "--checkpoint.dirpath", "ckpt", cwd=tmp_path)  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-2000:]
    warnings = [line for line in (fit.stdout + fit.stderr).splitlines() if WARNING_LINE.search(line)]
    assert not warnings, warnings
    assert "gridtnp: step 3/6, train/loss" in fit.stdout and "gridtnp: step 6/6" in fit.stdout
    assert "\r" not in fit.stdout  # no progress-bar refreshes in a log file
    assert not leftover.exists()

    test = gridtnp("test", *common, "--ckpt_path", "ckpt/last.ckpt", cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-2000:]
    assert test.stdout.count("test/loglik") == 1, test.stdout  # gridtnp's table, not Lightning's as well
    warnings = [line for line in (test.stdout + test.stderr).splitlines() if WARNING_LINE.search(line)]
    assert not warnings, warnings


def test_a_mistake_through_the_console_entry_point_is_one_line_and_status_2(tmp_path):
    done = gridtnp("fit", "--config", RECIPE, "--model.init_args.lrr", "0.1", cwd=tmp_path)
    assert done.returncode == 2
    arguments = sorted(p for p in inspect.signature(NeuralProcessModule.__init__).parameters if p != "self")
    assert {"lr", "lr_scaling", "warmup_steps", "weight_decay"} <= set(arguments)
    assert done.stderr.strip().splitlines() == [
        "gridtnp: error: NeuralProcessModule has no argument 'lrr' (did you mean 'lr'?). Its arguments: "
        f"{', '.join(arguments)}."
    ]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_gridtnp_warnings_print_as_one_line_without_python_source(tmp_path: Path) -> None:
    """A warning of gridtnp's own (here: a day missing between two input files) prints as ``gridtnp: warning: ...``,
    without the file name, line number and source line Python adds."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    for day in (1, 3):
        time = pd.date_range(f"2020-01-0{day}", periods=24, freq="h")
        values = np.zeros((24, 2, 2), np.float32)
        coords = {"time": time, "latitude": [50.0, 51.0], "longitude": [0.0, 1.0]}
        field = xr.Dataset({"t2m": (("time", "latitude", "longitude"), values)}, coords=coords)
        field.to_netcdf(tmp_path / f"{day}.nc")
    run = gridtnp("data", "prepare", "1.nc", "3.nc", "--out", "gap.zarr", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stderr.splitlines()
    said = "gridtnp: warning: 2 input(s) from 1.nc: the time axis skips 24 steps"
    assert any(line.startswith(said) for line in lines), run.stderr
    assert not [line for line in lines if re.search(r"\.py:\d+: |UserWarning|warn_time_gaps\(", line)], run.stderr
