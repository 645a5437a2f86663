"""Persistent DataLoader workers of the training stream: the same workers serve every epoch, each epoch (and a
resumed epoch's remaining batches) with the batches a single process draws."""

from __future__ import annotations

import os

import torch
from torch.utils.data import get_worker_info

from gridtnp.batch import Batch
from gridtnp.data.datamodules import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments


class _Pid:
    """A task generator whose batches carry the id of the process that drew them."""

    def __init__(self, task: object) -> None:
        self.inner = task

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        batch = self.inner.sample(batch_size, generator)
        info = get_worker_info()
        batch.extras["pid"] = torch.tensor([os.getpid() if info is not None else -1])
        return batch


def _epochs(workers: int, epochs: int, resume: dict | None = None) -> tuple[list[list[float]], set[int]]:
    spec = {"name": "gp1d", "max_context": 8, "num_targets": 8}
    dm = from_flat_arguments(SyntheticDataModule, spec, batch_size=2, train_batches=4, num_workers=workers)
    dm.split_task = lambda split, task=dm.split_task: _Pid(task(split))  # type: ignore[method-assign]
    loader = dm.train_dataloader()
    if resume is not None:
        loader.load_state_dict(resume)
    sums, pids = [], set()
    for _ in range(epochs):
        batches = list(loader)
        sums.append(sorted(round(b.target.y.sum().item(), 5) for b in batches))
        pids |= {int(b.extras["pid"]) for b in batches}
    return sums, pids


def test_persistent_workers_draw_each_epochs_batches_and_survive_epochs() -> None:
    serial, _ = _epochs(0, 3)
    parallel, pids = _epochs(2, 3)
    assert parallel == serial and serial[0] != serial[1]
    assert len(pids) == 2  # two workers for the three epochs, not two per epoch
    resumed, _ = _epochs(2, 2, {"seed": 0, "epoch": 1, "consumed": 2, "num_batches": 4})
    full, _ = _epochs(0, 3)
    assert set(resumed[0]) < set(full[1]) and len(resumed[0]) == 2  # the rest of epoch 1
    assert resumed[1] == full[2]


def _eval_runs(workers: int, runs: int) -> tuple[list[list[float]], set[int]]:
    spec = {"name": "gp1d", "max_context": 8, "num_targets": 8}
    dm = from_flat_arguments(SyntheticDataModule, spec, batch_size=2, val_batches=3, num_workers=workers)
    dm.split_task = lambda split, task=dm.split_task: _Pid(task(split))  # type: ignore[method-assign]
    loader = dm.val_dataloader()
    sums, pids = [], set()
    for _ in range(runs):  # Lightning iterates the same validation loader at every validation run
        batches = list(loader)
        sums.append([round(b.target.y.sum().item(), 5) for b in batches])
        pids |= {int(b.extras["pid"]) for b in batches}
    return sums, pids


def test_evaluation_workers_persist_and_give_the_fixed_set() -> None:
    serial, _ = _eval_runs(0, 1)
    parallel, pids = _eval_runs(2, 3)
    assert parallel == serial * 3  # the same fixed batches, in order, at every run
    assert len(pids) == 2  # two workers for the three runs, not two per run
