"""Training throughput as a callback: tasks per second consumed, the share of time spent waiting for data, and
(on CUDA) the GPU's utilisation, logged and optionally written to a JSON summary.

    gridtnp fit --config recipes/era5_swin_global.yaml --trainer.callbacks+=gridtnp.training.throughput.Throughput

Where the time goes in a step: Lightning fetches the next batch between one ``on_train_batch_end`` and the next
``on_train_batch_start``, so that gap is the time the training loop waited for the DataLoader (its workers were
slower than the step; validation runs are taken out); the rest is the step itself. With CUDA the step is
asynchronous, so a wait for data can overlap queued GPU work: the GPU's own utilisation (NVML, sampled by a
background thread every ``interval`` s, as ``nvidia-smi`` reports it) says whether the accelerator was busy.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only


class _UtilisationSampler(threading.Thread):
    """Samples ``torch.cuda.utilization`` (percent of time a kernel ran) and memory every ``interval`` seconds."""

    def __init__(self, device: torch.device, interval: float) -> None:
        super().__init__(daemon=True)
        self.device, self.interval = device, interval
        self.samples: list[tuple[float, float, float]] = []  # (time, utilisation %, memory used GiB)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            used = torch.cuda.device_memory_used(self.device) / 2**30
            self.samples.append((time.perf_counter(), float(torch.cuda.utilization(self.device)), used))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5 * self.interval)


def gpu_sampling_available(device: torch.device) -> bool:
    """Whether NVML utilisation can be read for ``device`` (CUDA with ``nvidia-ml-py`` installed)."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.utilization(device)
    except Exception:  # no pynvml / amdsmi, or a driver that does not answer
        return False
    return True


class Throughput(L.Callback):
    """Logs ``train/tasks_per_s``, ``train/data_wait`` (share of wall time waiting for the DataLoader) and, on
    CUDA, ``train/gpu_utilisation`` (percent) over windows of ``window`` steps; skips the first ``warmup`` steps
    (worker start-up, compilation, cuDNN autotuning) in the summary written to ``summary`` (JSON) at the end."""

    def __init__(self, window: int = 50, warmup: int = 20, interval: float = 0.5, summary: str | None = None) -> None:
        if window < 1 or warmup < 0 or interval <= 0:
            raise ValueError(
                f"Throughput: needs window >= 1, warmup >= 0 and interval > 0; got {window}, {warmup}, {interval}."
            )
        self.window, self.warmup, self.interval = window, warmup, interval
        self.summary = Path(summary) if summary else None
        self._reset()

    def _reset(self) -> None:
        self._sampler: _UtilisationSampler | None = None
        self._last_end: float | None = None
        self._start: float | None = None
        self._steps = self._tasks = 0
        self._wait = self._step_time = 0.0
        self._window_start: float | None = None
        self._window_tasks = 0
        self._window_wait = 0.0
        self._batch_start = 0.0
        self._validation_start: float | None = None
        self._paused = 0.0  # validation since the last training batch
        self._excluded = self._window_excluded = 0.0  # validation inside the measurement / the window
        self._first_step = 0  # the global step this process started training at (> 0 when resumed)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        self._first_step = trainer.global_step
        if trainer.is_global_zero and gpu_sampling_available(pl_module.device):
            self._sampler = _UtilisationSampler(pl_module.device, self.interval)
            self._sampler.start()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validation_start is not None:  # validation is neither a wait for data nor training time
            self._paused += time.perf_counter() - self._validation_start
        self._validation_start = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._batch_start = now
        if self._last_end is None:
            return
        wait = now - self._last_end - self._paused
        self._window_wait += wait
        self._window_excluded += self._paused
        if self._start is not None:
            self._wait += wait
            self._excluded += self._paused
        self._paused = 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        tasks = int(batch.batch_size) * trainer.world_size
        self._last_end = now
        count = trainer.global_step - self._first_step  # optimiser steps in this process, this one included
        if count == self.warmup:  # measurement starts after the warm-up steps
            self._start = now
            self._new_window(now)
            return
        if self._start is not None and count > self.warmup:
            self._steps += 1
            self._tasks += tasks
            self._step_time += now - self._batch_start
        if self._window_start is None:
            self._new_window(now)
            return
        self._window_tasks += tasks
        if count % self.window == 0:
            elapsed = now - self._window_start - self._window_excluded
            metrics = {
                "train/tasks_per_s": self._window_tasks / elapsed,
                "train/data_wait": self._window_wait / elapsed,
            }
            if self._sampler is not None and self._sampler.samples:
                recent = [u for t, u, _ in self._sampler.samples if t >= self._window_start]
                if recent:
                    metrics["train/gpu_utilisation"] = sum(recent) / len(recent)
            pl_module.log_dict(metrics, rank_zero_only=True)
            self._new_window(now)

    def _new_window(self, now: float) -> None:
        self._window_start, self._window_tasks, self._window_wait, self._window_excluded = now, 0, 0.0, 0.0

    def result(self) -> dict[str, Any]:
        """The summary after the warm-up: steps, tasks, seconds, tasks/s, data-wait share, GPU utilisation."""
        end = self._last_end or time.perf_counter()
        elapsed = end - self._start - self._excluded if self._start is not None else 0.0
        out: dict[str, Any] = {
            "warmup_steps": self.warmup,
            "steps": self._steps,
            "tasks": self._tasks,
            "seconds": round(elapsed, 3),
            "tasks_per_s": round(self._tasks / elapsed, 2) if elapsed > 0 else None,
            "data_wait": round(self._wait / elapsed, 4) if elapsed > 0 else None,
            "step_seconds": round(self._step_time / self._steps, 5) if self._steps else None,
        }
        if self._sampler is not None and self._start is not None:
            kept = [(u, m) for t, u, m in self._sampler.samples if self._start <= t <= end]
            if kept:
                util = sorted(u for u, _ in kept)
                out["gpu_utilisation_mean"] = round(sum(util) / len(util), 1)
                out["gpu_utilisation_median"] = util[len(util) // 2]
                out["gpu_memory_used_gib_max"] = round(max(m for _, m in kept), 2)
                out["gpu_samples"] = len(kept)
        return out

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self._write(trainer)

    @rank_zero_only
    def _write(self, trainer: L.Trainer) -> None:
        if self.summary is None:
            return
        self.summary.parent.mkdir(parents=True, exist_ok=True)
        record = {**self.result(), "world_size": trainer.world_size, "precision": str(trainer.precision)}
        self.summary.write_text(json.dumps(record, indent=1) + "\n")


__all__ = ["Throughput", "gpu_sampling_available"]
