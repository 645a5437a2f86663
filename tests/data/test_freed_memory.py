"""DataLoader workers and ``gridtnp data prepare`` keep freed memory in their heap (``gridtnp.data.freed_memory``):
a large array freed and allocated again reuses its pages instead of faulting in fresh ones."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from gridtnp.data import StationReanalysisDataModule
from gridtnp.data.datamodules import SyntheticDataModule
from gridtnp.data.freed_memory import keep_freed_memory, worker_init
from gridtnp.data.sections import from_flat_arguments
from gridtnp.libc import c_function
from tests.data.test_prepare import synthetic, write_nc

GLIBC = c_function("gnu_get_libc_version") is not None
pytestmark = pytest.mark.skipif(not GLIBC, reason="mallopt's settings are glibc's")
ROOT = Path(__file__).resolve().parents[2]


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _returned_here() -> int:
    """How much of a freed 64 MiB array this process gave back to the kernel (resident memory before less after)."""
    array = np.ones(16 * 2**20, dtype=np.float32)
    before = _resident_bytes()
    del array
    return before - _resident_bytes()


class _ReturnedOnFree(IterableDataset):
    """Yields ``_returned_here()`` measured in a DataLoader worker."""

    def __iter__(self):
        yield torch.tensor(_returned_here())


def _returned(init) -> int:
    loader = torch.utils.data.DataLoader(_ReturnedOnFree(), batch_size=None, num_workers=1, worker_init_fn=init)
    return int(next(iter(loader)))


def test_a_worker_keeps_freed_arrays_for_the_next_batch() -> None:
    # By default a large array is its own mapping, returned to the kernel when freed (and faulted in and zeroed
    # again the next time); kept in the heap, its pages serve the next allocation. The workers fork from a fresh
    # interpreter: a worker inherits its parent's malloc state, which other tests in this process change.
    code = (
        "from tests.data.test_freed_memory import _returned, worker_init; "
        "print(_returned(None), _returned(worker_init))"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRIDTNP_KEEP_FREED_MEMORY"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    default, kept = map(int, run.stdout.split())
    assert default > 48 * 2**20 and kept < 4 * 2**20, (default, kept)


def test_the_prepare_command_keeps_freed_memory_in_its_own_process(tmp_path: Path) -> None:
    write_nc(synthetic(np.arange(-2.0, 2.5, 1.0), np.arange(0.0, 4.0, 1.0)), tmp_path / "in.nc")
    code = (
        "import sys; from gridtnp.cli import main; from tests.data.test_freed_memory import _returned_here; "
        "before = _returned_here(); main(['data', 'prepare', sys.argv[1], '--out', sys.argv[2], '--quiet']); "
        "print(before, _returned_here())"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRIDTNP_KEEP_FREED_MEMORY"}
    args = [sys.executable, "-c", code, str(tmp_path / "in.nc"), str(tmp_path / "out.zarr")]
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    default, kept = map(int, run.stdout.split())
    assert default > 48 * 2**20 and kept < 4 * 2**20, (default, kept)
    assert (tmp_path / "out.zarr").is_dir()


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDTNP_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False


def test_the_station_task_sets_it_in_its_workers_only() -> None:
    assert (
        from_flat_arguments(StationReanalysisDataModule, num_workers=2).loader_kwargs()["worker_init_fn"] is worker_init
    )
    assert from_flat_arguments(StationReanalysisDataModule, num_workers=0).loader_kwargs()["worker_init_fn"] is None
    assert from_flat_arguments(SyntheticDataModule, "gp1d", num_workers=2).loader_kwargs()["worker_init_fn"] is None
