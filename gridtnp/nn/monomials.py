"""Polynomial bases of offsets ``[..., Dx]``: the monomials of a local Taylor expansion, as the residual's
regression uses them to describe the shape of a field around a target."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def shape_basis(offsets: Tensor, degree: int = 2) -> Tensor:
    """The monomials of degree 1 to ``degree`` of offsets ``[..., Dx]`` -> ``[..., P]``, in graded order.

    ``degree`` 2: ``phi(o) = [o_i, o_i^2, o_i o_j (i < j)]``, P = Dx (Dx + 3) / 2; 3 adds the cubic monomials
    (P = 9 for Dx = 2); 1: the offsets alone.
    """
    terms = [offsets]
    if degree >= 2:
        dx = offsets.shape[-1]
        rows, cols = torch.triu_indices(dx, dx, 1, device=offsets.device)
        terms += [offsets.square(), offsets[..., rows] * offsets[..., cols]]
    for d in range(3, degree + 1):
        for powers in itertools.combinations_with_replacement(range(offsets.shape[-1]), d):
            terms.append(offsets[..., list(powers)].prod(-1, keepdim=True))
    return torch.cat(terms, -1)


def basis_size(dim_x: int, degree: int) -> int:
    """P of ``shape_basis``: the number of monomials of degree 1 to ``degree`` in ``dim_x`` variables."""
    return math.comb(dim_x + degree, degree) - 1


__all__ = ["basis_size", "shape_basis"]
