"""The batch that every DataModule yields and every model consumes.

Shapes: ``x [B, N, Dx]``, ``y [B, N, Dy]``, ``mask [B, N]`` (bool, ``True`` = a real point).
Sets of different sizes in one batch are padded to the largest and masked; padded points
never change a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

#: Source name used when a task has one context set.
DEFAULT_SOURCE = "points"

#: The per-task extras a batch may carry (``Batch.extras``): key -> (shape, who sets it and what reads it).
#: Every extra is per task (leading dimension B); the shapes of these keys are checked when a batch is made. These
#: are the ones gridtnp's core reads; a task adds its own with ``declare_extras`` (the GP tasks' kernels, say).
EXTRAS: dict[str, tuple[str, str]] = {
    "target_scale": ("[B]", "std of the target variable in physical units: the *_physical metrics"),
    "oracle_loglik": ("[B]", "mean per-target log-density under the true posterior (GP tasks): oracle_loglik"),
    "hour": ("[B]", "time index of the task's hour in the store (station tasks): predictions' time coordinate"),
    "start_hour": ("[B]", "time index of the first hour (multi-source tasks): predictions' time coordinate"),
    "is_context": ("[B, Nt]", "bool, the target was also a context point: the context/ and heldout/ metrics"),
    "coarse_sq_err": ("[B, Nt]", "squared normalised error of the coarse-cell baseline: the baseline_* metrics"),
}


class BatchError(ValueError):
    """A batch whose tensors do not have the documented shapes or types."""


#: The shapes an extra may have: per task, or per task and target point.
EXTRA_SHAPES = ("[B]", "[B, Nt]")


def declare_extras(owner: str, extras: dict[str, tuple[str, str]]) -> None:
    """Declare the extras ``owner`` (a task or DataModule) puts in ``Batch.extras``: key -> (shape, meaning).

    Their shapes are checked in every batch from then on; a key declared twice must keep its shape.
    """
    for key, (shape, meaning) in extras.items():
        if shape not in EXTRA_SHAPES:
            raise ValueError(f"{owner}: extras[{key!r}] has shape {shape!r}; allowed: {', '.join(EXTRA_SHAPES)}.")
        if key in EXTRAS and EXTRAS[key][0] != shape:
            raise ValueError(f"{owner}: extras[{key!r}] is already declared with shape {EXTRAS[key][0]}, not {shape}.")
        EXTRAS.setdefault(key, (shape, f"{meaning} ({owner})"))


@dataclass
class Observations:
    """A padded set of observations: ``x [B, N, Dx]``, ``y [B, N, Dy]``, ``mask [B, N]``."""

    x: Tensor
    y: Tensor | None = None
    mask: Tensor | None = None
    name: str = "observations"

    def __post_init__(self) -> None:
        where = self.name
        if not isinstance(self.x, Tensor) or self.x.dim() != 3:
            raise BatchError(f"{where}: x must be a tensor [B, N, Dx]; got {_shape(self.x)}.")
        b, n = self.x.shape[:2]
        if self.y is not None and (not isinstance(self.y, Tensor) or self.y.dim() != 3 or self.y.shape[:2] != (b, n)):
            raise BatchError(
                f"{where}: y must be [B, N, Dy] with the B and N of x; x is {_shape(self.x)}, y is {_shape(self.y)}."
            )
        if self.mask is None:
            self.mask = torch.ones(b, n, dtype=torch.bool, device=self.x.device)
        elif not isinstance(self.mask, Tensor) or self.mask.shape != (b, n) or self.mask.dtype != torch.bool:
            raise BatchError(
                f"{where}: mask must be a bool tensor [B, N] = {(b, n)}; got {_shape(self.mask)}"
                f"{'' if not isinstance(self.mask, Tensor) else ' of ' + str(self.mask.dtype)}."
            )

    @property
    def batch_size(self) -> int:
        return self.x.shape[0]

    @property
    def num_points(self) -> int:
        return self.x.shape[1]

    def valid(self) -> Tensor:
        """``[B, N]`` mask with points whose ``y`` is NaN or +-inf (missing values) removed."""
        if self.y is None:
            return self.mask
        return self.mask & torch.isfinite(self.y).all(-1)

    def to(self, device: torch.device | str) -> Observations:
        """The same observations on ``device``."""
        y = None if self.y is None else self.y.to(device, non_blocking=True)
        return Observations(self.x.to(device, non_blocking=True), y, self.mask.to(device, non_blocking=True), self.name)

    def pin_memory(self) -> Observations:
        return Observations(
            self.x.pin_memory(), None if self.y is None else self.y.pin_memory(), self.mask.pin_memory(), self.name
        )


@dataclass
class Batch:
    """Context per source (``{name: Observations}``), targets, and optional per-task extras (``EXTRAS``)."""

    context: dict[str, Observations]
    target: Observations
    extras: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.context, dict) or not self.context:
            raise BatchError("Batch.context must be a non-empty dict {source name: Observations}.")
        b = self.target.batch_size
        for name, obs in self.context.items():
            if obs.batch_size != b:
                raise BatchError(f"context[{name!r}] has batch size {obs.batch_size} but target has {b}.")
            if obs.y is None:
                raise BatchError(f"context[{name!r}] has no y values.")
            if obs.x.shape[-1] != self.target.x.shape[-1]:
                raise BatchError(
                    f"context[{name!r}].x has Dx={obs.x.shape[-1]} but target.x has Dx={self.target.x.shape[-1]}."
                )
        self._check_extras()
        # Checked where batches are made (on the CPU), not again on every device transfer: that would sync the GPU.
        x = self.target.x
        finite = x.device.type != "cpu" or bool(torch.isfinite(x).all())  # then no masked copy of x is needed
        if not finite and not torch.isfinite(x[self.target.mask]).all():
            bad = (~torch.isfinite(x) & self.target.mask.unsqueeze(-1)).any(-1).nonzero()[0].tolist()
            raise BatchError(
                f"target.x has a NaN or infinite location (task {bad[0]}, point {bad[1]}): a prediction needs a "
                "location. Drop the point, or mask it out (target mask False)."
            )

    def _check_extras(self) -> None:
        b, nt = self.target.x.shape[:2]
        shapes = {"[B]": (b,), "[B, Nt]": (b, nt)}
        for key, value in self.extras.items():
            if key in EXTRAS:
                want = shapes[EXTRAS[key][0]]
                if not isinstance(value, Tensor) or tuple(value.shape) != want:
                    raise BatchError(f"extras[{key!r}] must be {EXTRAS[key][0]} = {list(want)}; got {_shape(value)}.")
            elif not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != b:
                raise BatchError(
                    f"extras[{key!r}] must be a per-task tensor [B, ...] with B = {b}; got {_shape(value)}. "
                    f"Declared extras (gridtnp.batch.EXTRAS): {', '.join(EXTRAS)}."
                )

    @property
    def batch_size(self) -> int:
        return self.target.batch_size

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            {k: v.to(device) for k, v in self.context.items()},
            self.target.to(device),
            {k: v.to(device) for k, v in self.extras.items()},
        )

    def pin_memory(self) -> Batch:
        return Batch(
            {k: v.pin_memory() for k, v in self.context.items()},
            self.target.pin_memory(),
            {k: v.pin_memory() for k, v in self.extras.items()},
        )


def _shape(t: object) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__
