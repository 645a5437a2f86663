"""Learning-rate schedules of ``NeuralProcessModule``: a linear warm-up, then constant or a cosine decay to 0 at the
end of the run's budget, in optimiser steps (``trainer.max_steps``) or in time (``trainer.max_time``).

* ``time_budget(trainer)``: the Lightning ``Timer`` that stops a run at ``max_time``, or None.
* ``Schedule(warmup, cosine, total_steps, timer)``: the factor on the base learning rate at each step
  (``torch.optim.lr_scheduler.LambdaLR``); ``adamw_with_schedule(module, lr, ...)``: the optimiser and schedule.

With a time budget the cosine's progress is ``max(steps done / max_steps, elapsed / max_time)``: the learning rate
reaches 0 when the first of the two limits stops the run. Elapsed time is the ``Timer``'s (training, validation and
checkpointing included, carried over when a run resumes), so such runs are not bit-reproducible: the learning rate
at a given step depends on how fast the machine was.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer

from gridtnp.registry import ConfigError


def time_budget(trainer: Any) -> Timer | None:
    """The trainer's ``Timer`` callback when ``max_time`` bounds the run (Lightning adds one), else None."""
    for callback in getattr(trainer, "callbacks", []):
        if isinstance(callback, Timer) and callback.time_remaining() is not None:
            return callback
    return None


def budget_seconds(timer: Timer) -> float:
    """The whole time budget of ``timer`` in seconds (elapsed plus remaining)."""
    return timer.time_elapsed() + (timer.time_remaining() or 0.0)


class Schedule:
    """Factor on the base learning rate at optimiser step ``step``: ``(step + 1) / warmup`` during the warm-up, then 1
    (constant) or ``(1 + cos(pi * progress)) / 2`` (cosine), ``progress`` in [0, 1] as in the module docstring.

    Args:
        warmup: warm-up steps.
        cosine: decay after the warm-up (else constant).
        total_steps: the step budget (``max_steps``), or None when only time bounds the run.
        timer: the time budget's ``Timer``, or None.
    """

    def __init__(self, warmup: int, cosine: bool, total_steps: int | None, timer: Timer | None) -> None:
        if cosine and total_steps is None and timer is None:
            raise ValueError("a cosine schedule needs a step budget or a time budget")
        self.warmup, self.cosine, self.total_steps, self.timer = warmup, cosine, total_steps, timer

    def progress(self, step: int) -> float:
        """Share of the budget used at ``step``: the larger of the step share (after the warm-up) and the time share."""
        done = 0.0
        if self.total_steps is not None:
            done = (step - self.warmup) / max(self.total_steps - self.warmup, 1)
        if self.timer is not None:
            done = max(done, self.timer.time_elapsed() / max(budget_seconds(self.timer), 1e-9))
        return min(max(done, 0.0), 1.0)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if not self.cosine:
            return 1.0
        return 0.5 * (1.0 + math.cos(math.pi * self.progress(step)))


def restore_recipe_lr(trainer: L.Trainer | None, lr: float) -> None:
    """A resumed run uses the learning rate ``lr`` of its recipe, not the one restored with the optimiser state
    (its schedules' base rates included); says so when they differed."""
    if trainer is None or trainer.ckpt_path is None:
        return
    changed = False
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        if hasattr(scheduler, "base_lrs") and any(b != lr for b in scheduler.base_lrs):
            changed = True
            scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
            lambdas = getattr(scheduler, "lr_lambdas", None)
            for i, group in enumerate(scheduler.optimizer.param_groups):
                factor = lambdas[i](scheduler.last_epoch) if lambdas else 1.0
                group["initial_lr"], group["lr"] = lr, lr * factor
    if not trainer.lr_scheduler_configs:
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                changed = changed or group["lr"] != lr
                group["lr"] = lr
    if changed and trainer.is_global_zero:
        print(f"gridtnp: resumed with the recipe's learning rate {lr:g} (the checkpoint had another)")


def total_steps(trainer: L.Trainer, required: bool = True) -> int | None:
    """Optimiser steps of the run, for the cosine schedule: ``max_steps``, else Lightning's estimate; None when the
    run has no step bound and ``required`` is False (a time budget bounds it)."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps)
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total) or total <= 0:
        if not required:
            return None
        raise ConfigError(
            "lr_schedule 'cosine' needs a finite run length: set trainer.max_steps or trainer.max_time (or "
            "max_epochs with a finite training set)."
        )
    return int(total)


def adamw_with_schedule(
    module: L.LightningModule, lr: float, weight_decay: float, warmup_steps: int, lr_schedule: str
) -> Any:
    """``configure_optimizers``' answer: AdamW at ``lr`` with the warm-up and the ``"constant"`` or ``"cosine"``
    schedule (a step-wise ``LambdaLR``), or the bare optimiser when neither changes the rate."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    if warmup_steps <= 0 and lr_schedule == "constant":
        return optimizer
    cosine = lr_schedule == "cosine"
    timer = time_budget(module.trainer) if cosine else None
    total = total_steps(module.trainer, required=timer is None) if cosine else None
    schedule = Schedule(warmup_steps, cosine, total, timer)
    # A plain function, not the Schedule object: LambdaLR would store the object's attributes in the checkpoint.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
