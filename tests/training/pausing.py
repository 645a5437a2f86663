"""A callback for the signal tests: each rank writes its process id, and training or validation pauses once at a
known point so that a test can signal one rank or all of them there (``--trainer.callbacks``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L


class Pause(L.Callback):
    """Write ``{out}/pid{rank}`` when training starts; pause once, on every rank, at the start of the first
    validation batch after ``validation_at_step`` optimiser steps, writing ``{out}/paused{rank}`` (only once per
    ``out``, so a relaunched run goes on).

    Args:
        out: directory of the marker files.
        validation_at_step: the step whose validation pauses (None: none).
        seconds: the longest pause.
    """

    def __init__(self, out: str, validation_at_step: int | None = None, seconds: float = 60.0) -> None:
        self.out, self.validation_at_step, self.seconds = Path(out), validation_at_step, seconds

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"pid{trainer.global_rank}").write_text(str(os.getpid()))

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        marker = self.out / f"paused{trainer.global_rank}"
        if trainer.sanity_checking or trainer.global_step != self.validation_at_step or marker.exists():
            return
        marker.write_text(str(trainer.global_step))
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
