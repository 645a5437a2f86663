"""A callback for the scale-out tests, passed to ``gridtnp fit`` with ``--trainer.callbacks tests.recording.Record``.

It appends one JSON line per event to ``{out}/rank{global_rank}.jsonl`` (a run relaunched in the same ``out``
appends to the same files) and can pause training once, so that a test can kill or signal the process at a known
point.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from gridtnp.batch import Batch


def fingerprint(batch: Batch) -> float:
    """A number that identifies a batch's tasks (the sum of its target values)."""
    return float(torch.nan_to_num(batch.target.y.double()).sum())


class Record(Callback):
    """Record every training step's loss and tasks, every validation batch's tasks and the reduced metrics.

    Args:
        out: directory of the per-rank JSON-lines files.
        pause_at_step: at the start of the batch after this many optimiser steps, write ``{out}/paused`` and sleep
            (up to ``pause_seconds``); only once per ``out``, so a relaunched run goes on.
        pause_seconds: the longest pause.
    """

    def __init__(self, out: str, pause_at_step: int | None = None, pause_seconds: float = 300.0) -> None:
        self.out, self.pause_at_step, self.pause_seconds = Path(out), pause_at_step, pause_seconds

    def _write(self, trainer: L.Trainer, **record: Any) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"rank": trainer.global_rank, "world_size": trainer.world_size, **record}) + "\n")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        marker = self.out / "paused"
        if self.pause_at_step is not None and trainer.global_step == self.pause_at_step and not marker.exists():
            self.out.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(trainer.global_step))
            deadline = time.monotonic() + self.pause_seconds
            while time.monotonic() < deadline:
                time.sleep(0.1)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._write(trainer, kind="train", step=trainer.global_step, loss=float(loss), task=fingerprint(batch))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, kind="val", step=trainer.global_step, task=fingerprint(batch))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
            self._write(trainer, kind="val_metrics", step=trainer.global_step, metrics=metrics)


def read_records(out: Path, rank: int = 0) -> list[dict[str, Any]]:
    """The records a ``Record`` callback wrote for ``rank``."""
    path = Path(out) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
