"""Gaussian kernel values that never enter the subnormal range of their floating-point type.

``exp(-0.5 r^2)`` reaches the subnormal range of float32 (below 1.2e-38) about 13 length-scales from a point, and
its products over the axes of a separable kernel sooner. Intel cores pay a large penalty per subnormal operand in
MKL's matrix products (a ``[2, 129, 4096] @ [2, 4096, 1024]`` product of SE weights took 335 ms instead of 11 ms
with 5 % of them subnormal), and ``torch.set_flush_denormal`` does not reach MKL's worker threads. So every hot
path that evaluates such a kernel sets values below a floor to exactly zero: ``2 ** (0.8 log2(tiny) / factors)``
for a product of ``factors`` values, i.e. a product stays at least ``tiny ** 0.8`` (about 1e-30 in float32 and
bfloat16, 1e-246 in float64), far enough above ``tiny`` that multiplying it by O(1) values stays normal too. The
values cut are below 1e-30 of the kernel's peak: predictions do not change.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: The floor of a product of kernel values, as a power of the type's smallest normal number: ``tiny ** 0.8``.
FLOOR_EXPONENT = 0.8


def log_floor(dtype: torch.dtype, factors: int = 1) -> float:
    """Natural log of the smallest value kept for one of ``factors`` multiplied kernel values of ``dtype``."""
    return FLOOR_EXPONENT * math.log(torch.finfo(dtype).tiny) / factors


def gaussian(sq: Tensor, factors: int = 1) -> Tensor:
    """``exp(-sq / 2)`` for squared scaled distances ``sq >= 0`` (any shape), zero below the floor of ``factors``.

    ``factors``: how many such values are multiplied together downstream (the dimensions of a separable kernel).
    """
    arg = -0.5 * sq
    return torch.where(arg >= log_floor(sq.dtype, factors), torch.exp(arg), 0.0)


def exp_floored(arg: Tensor, factors: int = 1) -> Tensor:
    """``exp(arg)`` (any shape) with values below the floor of ``factors`` multiplied values set to zero."""
    return torch.where(arg >= log_floor(arg.dtype, factors), torch.exp(arg), 0.0)


def floor_logits(logits: Tensor, dim: int = -1) -> Tensor:
    """``logits`` with ``-inf`` where their softmax weight along ``dim`` would fall below the floor (any shape).

    Compared against the largest logit along ``dim`` (an upper bound of the log normaliser), so the weights kept
    are a superset of those above the floor and the softmax of the result differs by less than the floor.
    """
    peak = logits.detach().amax(dim, keepdim=True)
    return logits.masked_fill(logits < peak + log_floor(logits.dtype), float("-inf"))


def subnormal_count(values: Tensor) -> int:
    """How many entries of ``values`` are subnormal (nonzero and below the type's smallest normal number)."""
    magnitude = values.detach().abs()
    return int(((magnitude > 0) & (magnitude < torch.finfo(values.dtype).tiny)).sum())


__all__ = ["exp_floored", "floor_logits", "gaussian", "log_floor", "subnormal_count"]
