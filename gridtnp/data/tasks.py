"""What a synthetic task is, and the random draws and argument checks the task generators share.

A task is a registered class (``@register("task", name)``) with ``dim_x``, ``dim_y`` (per context source),
``target_dim_y`` and ``sample(batch_size, generator) -> Batch``. All randomness comes from the
``torch.Generator`` passed to ``sample``, so a batch is a pure function of the generator's seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from gridtnp.batch import Batch
from gridtnp.registry import ConfigError


@runtime_checkable
class Task(Protocol):
    """A generator of synthetic meta-learning batches."""

    dim_x: int
    dim_y: dict[str, int]
    target_dim_y: int

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A batch of ``batch_size`` independent tasks drawn with ``generator``."""
        ...


def uniform(shape: Sequence[int], low: float, high: float, generator: torch.Generator) -> Tensor:
    """float32 samples from U[low, high) of the given shape."""
    return low + (high - low) * torch.rand(tuple(shape), generator=generator)


def random_sizes(batch_size: int, low: int, high: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Per-task set sizes ``n [B]`` ~ U{low..high} and the padding mask ``[B, max(n)]`` (True = real)."""
    n = torch.randint(low, high + 1, (batch_size,), generator=generator)
    width = int(n.max()) if batch_size > 0 else 0
    mask = torch.arange(width)[None, :] < n[:, None]
    return n, mask


def check_sizes(task: str, min_name: str, low: int, max_name: str, high: int, smallest: int = 0) -> None:
    """Raise a ConfigError unless ``smallest <= low <= high``."""
    if not (smallest <= low <= high):
        raise ConfigError(
            f"{task}: need {smallest} <= {min_name} <= {max_name}; got {min_name}={low}, {max_name}={high}."
        )


def check_range(task: str, name: str, value: Sequence[float], allow_equal: bool = False) -> tuple[float, float]:
    """The ``(low, high)`` pair ``value`` as floats; a ConfigError unless low < high (or <= with ``allow_equal``)."""
    ok = len(value) == 2 and (float(value[0]) <= float(value[1]) if allow_equal else float(value[0]) < float(value[1]))
    if not ok:
        rule = "low <= high" if allow_equal else "low < high"
        raise ConfigError(f"{task}: {name} must be a pair (low, high) with {rule}; got {tuple(value)}.")
    return float(value[0]), float(value[1])


def check_positive(task: str, name: str, value: float, allow_zero: bool = False) -> float:
    """``value`` as a float; a ConfigError unless it is > 0 (or >= 0 with ``allow_zero``)."""
    if not (value > 0 or (allow_zero and value == 0)):
        raise ConfigError(f"{task}: {name} must be {'>= 0' if allow_zero else '> 0'}; got {value}.")
    return float(value)


def zero_padding(values: Tensor, mask: Tensor) -> Tensor:
    """``values [B, N, D]`` with padded points (``mask [B, N]`` False) set to zero."""
    return values * mask[..., None].to(values.dtype)


Ranges = tuple[tuple[float, float], ...]


def check_ranges(
    task: str, name: str, value: Sequence[float] | Sequence[Sequence[float]], shift: float = 0.0
) -> Ranges:
    """An input range as disjoint intervals: ``(low, high)`` or ``[(low, high), ...]`` (a union, e.g. the bimodal
    ``[[-4, -1], [1, 4]]``), each moved by ``shift``; a ConfigError unless every interval has low < high and they do
    not overlap."""
    pairs = [value] if len(value) == 2 and all(isinstance(v, (int, float)) for v in value) else list(value)
    try:
        ranges = sorted(check_range(task, name, pair) for pair in pairs)  # type: ignore[arg-type]
    except TypeError:
        ranges = []
    if not ranges:
        raise ConfigError(
            f"{task}: {name} must be a pair (low, high) or a list of pairs [[low, high], ...]; got {value!r}."
        )
    for (_, high), (low, _) in itertools.pairwise(ranges):
        if low < high:
            raise ConfigError(f"{task}: the intervals of {name} must not overlap; got {ranges}.")
    return tuple((low + shift, high + shift) for low, high in ranges)


def uniform_union(shape: Sequence[int], ranges: Ranges, generator: torch.Generator) -> Tensor:
    """float32 samples uniform on a union of disjoint intervals (an interval is chosen with probability proportional
    to its length); one interval draws exactly what ``uniform`` draws."""
    if len(ranges) == 1:
        return uniform(shape, *ranges[0], generator)
    lows = torch.tensor([r[0] for r in ranges])
    lengths = torch.tensor([r[1] - r[0] for r in ranges])
    # Map U[0, total) onto the intervals laid end to end: position p falls in interval i, at lows[i] + p - start_i.
    p = uniform(shape, 0.0, float(lengths.sum()), generator)
    starts = torch.cumsum(lengths, 0) - lengths
    index = (torch.searchsorted(starts, p.contiguous(), right=True) - 1).clamp(0, len(ranges) - 1)
    return lows[index] + (p - starts[index])
