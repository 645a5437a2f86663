"""GP conditioning of departures at context points on target locations: the one closed form behind the model's
``kriging`` slot, the ``mos_kriging`` baseline and the residual's ``departures``.

Departures ``r [B, Nc, Dy]`` seen at context points (mask ``valid [B, Nc]``) under a prior covariance ``K`` and a
nugget ``nu`` (noise: one for all points, or one per point) give each target ``x`` the posterior (eqs. 2.25-2.26 of
Rasmussen and Williams, 2006)::

    shift(x)     = k(x, X) (K + nu I)^-1 r
    explained(x) = k(x, X) (K + nu I)^-1 k(X, x)      (the prior variance that the context removes)

``condition`` factors ``K + nu I`` once per batch, ``posterior`` applies the factor to any chunk of targets. Padded
points get identity rows and columns and a zero departure, so every task of a batch is solved in one call with no
loop over tasks, and a padded point has no weight. ``rank_one_posterior`` is the same posterior in closed form when
each target's ``k`` neighbours are perfectly correlated with it (``K = 1 1^T``, ``k(x, X) = 1``) and see it with noise
``1 / a_j``: by Sherman-Morrison the weights are ``a_j / (1 + sum_i a_i)``, with no factor to compute.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor, nn


class Factor(NamedTuple):
    """What ``condition`` keeps of one batch's context points for ``posterior``."""

    cholesky: Tensor  # lower factor of K + nu I [B, Nc, Nc] (identity rows and columns at padded points)
    weights: Tensor  # (K + nu I)^-1 r [B, Nc, Dy] (zero at padded points)
    valid: Tensor  # [B, Nc]


def dense_kernel(kernel: nn.Module, xa: Tensor, xb: Tensor) -> Tensor:
    """A gpytorch kernel's matrix ``[B, Na, Nb]`` between ``xa [B, Na, Dx]`` and ``xb [B, Nb, Dx]`` as a tensor."""
    matrix = kernel(xa, xb)
    return matrix.to_dense() if hasattr(matrix, "to_dense") else matrix


def condition(
    gram: Tensor, departures: Tensor, valid: Tensor, nugget: Tensor | float, where: str, remedy: str | None = None
) -> Factor:
    """Factor ``K + nu I`` (``gram`` ``K [B, Nc, Nc]``, ``nugget`` a scalar or ``[B, Nc]``) and solve for the
    ``departures [B, Nc, Dy]`` at the ``valid [B, Nc]`` points.

    A ``K + nu I`` that is not positive definite raises a one-line ValueError naming ``where`` and ending with
    ``remedy`` (what the user can change); without ``remedy``, linear_operator's ``psd_safe_cholesky`` adds jitter
    to the failing tasks instead (with its warning), as gpytorch's exact GP does."""
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    noise = torch.diag_embed(nugget) if isinstance(nugget, Tensor) and nugget.dim() > 0 else nugget * eye
    matrix = torch.where(pair, gram, eye) + noise
    cholesky, info = torch.linalg.cholesky_ex(matrix)
    if bool((info > 0).any()):  # one sync, as torch.linalg.cholesky's own check
        if remedy is not None:
            raise ValueError(
                f"{where}: the context covariance K + nu I is not positive definite in {gram.dtype} for "
                f"{int((info > 0).sum())} task(s) (near-duplicate context points?); {remedy}."
            )
        cholesky = psd_safe_cholesky(matrix)
    weights = torch.cholesky_solve(torch.where(valid.unsqueeze(-1), departures, 0.0), cholesky)
    return Factor(cholesky, weights, valid)


def posterior(factor: Factor, cross: Tensor) -> tuple[Tensor, Tensor]:
    """The posterior shift ``[B, Nt, Dy]`` and explained variance ``[B, Nt]`` at targets whose prior covariance
    with the context points is ``cross`` ``k(x, X) [B, Nt, Nc]`` (columns of padded points are ignored)."""
    cross = torch.where(factor.valid.unsqueeze(-2), cross, 0.0)
    shift = cross @ factor.weights
    v = torch.linalg.solve_triangular(factor.cholesky, cross.transpose(-1, -2), upper=False)  # [B, Nc, Nt]
    return shift, v.square().sum(-2)


def rank_one_posterior(precision: Tensor, departures: Tensor) -> tuple[Tensor, Tensor]:
    """The posterior shift ``[B, Nt, Dy]`` and weights ``[B, Nt, k]`` of each target given ``k`` neighbours that see
    it with precision ``a`` ``[B, Nt, k]`` (0 at invalid neighbours) relative to a unit prior, and their
    ``departures [B, Nt, k, Dy]``: the weights ``a_j / (1 + sum_i a_i)`` sum to below 1, so the shift shrinks to
    zero away from all neighbours."""
    weights = precision / (1 + precision.sum(-1, keepdim=True))
    return (weights.unsqueeze(-1) * departures).sum(-2), weights


__all__ = ["Factor", "condition", "dense_kernel", "posterior", "rank_one_posterior"]
