"""Learning rate scaled with the global batch (``lr_scaling: {rule: linear, base_batch: 8}`` beside ``lr``), so that a
recipe tuned at one effective batch keeps its step size at any world size.

* ``LrScaling.of(spec)``: the checked option (``rule``: ``none`` | ``linear`` | ``sqrt``; ``base_batch``: the effective
  batch, in tasks, at which the recipe's ``lr`` was tuned).
* ``effective_batch(trainer, batch_size)``: tasks per optimiser step, ``batch_size x world_size x accumulated``.
* ``LrScaling.lr(lr, batch)``: ``lr x batch / base_batch`` (linear), ``lr x sqrt(batch / base_batch)`` (sqrt), ``lr``.

The warm-up (``warmup_steps``) and the cosine decay act on the scaled rate: the warm-up climbs to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gridtnp.registry import ConfigError

RULES = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class LrScaling:
    """How the learning rate follows the effective batch: ``rule`` from ``base_batch`` tasks per step."""

    rule: str = "none"
    base_batch: int | None = None

    @classmethod
    def of(cls, spec: dict[str, Any] | str | None) -> LrScaling:
        """The option from a recipe's ``lr_scaling`` mapping (or a bare rule name; None: no scaling)."""
        if spec is None:
            return cls()
        spec = {"rule": spec} if isinstance(spec, str) else dict(spec)
        unknown = set(spec) - {"rule", "base_batch"}
        if unknown:
            raise ConfigError(f"lr_scaling: unknown key(s) {sorted(unknown)}; allowed: rule, base_batch.")
        rule, base = spec.get("rule", "none"), spec.get("base_batch")
        if rule not in RULES:
            raise ConfigError(f"lr_scaling rule must be one of {', '.join(RULES)}; got {rule!r}.")
        if rule != "none" and (isinstance(base, bool) or not isinstance(base, int) or base < 1):
            raise ConfigError(
                f"lr_scaling rule {rule!r} needs base_batch, the effective batch (tasks per optimiser step) at "
                f"which lr was tuned, an integer >= 1; got {base!r}."
            )
        return cls(rule, base)

    def lr(self, lr: float, batch: int | None) -> float:
        """The learning rate at an effective batch of ``batch`` tasks per step."""
        if self.rule == "none":
            return lr
        if batch is None:
            raise ConfigError(
                f"lr_scaling rule {self.rule!r} needs the tasks per batch, but the DataModule has no batch_size; "
                "use rule 'none' with this DataModule."
            )
        ratio = batch / self.base_batch
        return lr * (ratio if self.rule == "linear" else math.sqrt(ratio))

    def describe(self, lr: float, batch: int | None) -> str:
        """One clause for the start line: the resulting rate and how it came from ``lr``."""
        if self.rule == "none":
            return f"learning rate {lr:g} (not rescaled with the batch size; see lr_scaling)"
        how = f"{batch}/{self.base_batch}" if self.rule == "linear" else f"sqrt({batch}/{self.base_batch})"
        base = f"{self.rule} lr_scaling, base batch {self.base_batch}"
        return f"learning rate {self.lr(lr, batch):g} = {lr:g} x {how} ({base})"


def effective_batch(trainer: Any, batch_size: int | None) -> int | None:
    """Tasks per optimiser step: ``batch_size x world_size x accumulate_grad_batches`` (None without a batch size)."""
    if batch_size is None or trainer is None:
        return batch_size
    return int(batch_size) * int(trainer.world_size) * int(trainer.accumulate_grad_batches)
