"""Gaussian-process maths for the synthetic tasks: kernels, exact posterior predictives and SKI sampling.

* ``kernel(family, lengthscale, period)``: a gpytorch kernel (``se``, ``matern52``, ``periodic``) with its
  hyperparameters set; ``mixed_kernel_matrix`` evaluates one family per task ``[B, N, N]``.
* ``posterior_predictive`` / ``predictive_loglik``: the exact GP posterior at the targets given the context,
  ``[B, N_t]``, and its mean log-density per target (the oracle of the GP tasks).
* ``SKIGrid``: draws of an SE GP on a Kronecker grid, cubically interpolated to any points (structured kernel
  interpolation), a few milliseconds per 11,000-point task instead of an O(n^3) Cholesky.

Everything runs in float64 and returns float32 on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gpytorch
import torch
from torch import Tensor

from gridtnp.registry import ConfigError

KERNELS = ("se", "matern52", "periodic")
#: SKI grids extend this many cells beyond the domain on each side, so every cubic stencil of a point in the
#: domain lies on the grid and no boundary handling is needed.
SKI_MARGIN = 2
#: Default SKI grid resolution: nodes per length-scale. At 4 the interpolated field's covariance is within 0.002
#: of the SE kernel; the gridded TNP paper's fixed 100 x 100 grid over [-6, 6]^2 has 0.8 nodes per length-scale at
#: l = 0.1, where the marginal variance drops to 0.73 between nodes.
SKI_NODES_PER_LENGTHSCALE = 4


def ski_grid_size(domain: tuple[float, float], lengthscale: float, grid_size: int | None) -> int:
    """``grid_size``, or (None) the nodes per dimension that give ``SKI_NODES_PER_LENGTHSCALE`` per length-scale."""
    if grid_size is not None:
        return int(grid_size)
    low, high = domain
    return math.ceil((high - low) * SKI_NODES_PER_LENGTHSCALE / lengthscale) + 1 + 2 * SKI_MARGIN


def kernel(family: str, lengthscale: Tensor, period: Tensor | None = None) -> gpytorch.kernels.Kernel:
    """A float64 gpytorch kernel with batch shape ``[b]`` and the given ``lengthscale [b]`` (and ``period [b]``).

    The periodic kernel is the standard ``exp(-2 sin^2(pi |x - x'| / p) / l^2)``; gpytorch divides the
    ``sin^2`` term by its ``lengthscale`` once, so it is given ``l^2``.
    """
    shape = torch.Size([lengthscale.shape[0]])
    if family == "se":
        k = gpytorch.kernels.RBFKernel(batch_shape=shape)
    elif family == "matern52":
        k = gpytorch.kernels.MaternKernel(nu=2.5, batch_shape=shape)
    elif family == "periodic":
        k = gpytorch.kernels.PeriodicKernel(batch_shape=shape)
    else:
        raise ConfigError(f"Unknown kernel family {family!r}; available: {', '.join(KERNELS)}.")
    k = k.to(torch.float64)
    lengthscale = lengthscale.to(torch.float64).view(-1, 1, 1)
    with torch.no_grad():
        if family == "periodic":
            if period is None:
                raise ValueError("The periodic kernel needs a period.")
            k.lengthscale = lengthscale.square()
            k.period_length = period.to(torch.float64).view(-1, 1, 1)
        else:
            k.lengthscale = lengthscale
    return k


def mixed_kernel_matrix(
    x: Tensor,
    family: Tensor,
    lengthscale: Tensor,
    period: Tensor,
    families: Sequence[str],
    periodic_lengthscale: float | None = None,
) -> Tensor:
    """Covariance ``[B, N, N]`` of ``x [B, N, D]``, task b using kernel ``families[family[b]]``.

    ``periodic_lengthscale``: the periodic kernel's length-scale for every task instead of ``lengthscale[b]``
    (the TE-TNP paper's ``k_pe`` is the standard form with length-scale 1 and period ``l``).
    """
    out = x.new_empty(x.shape[0], x.shape[1], x.shape[1], dtype=torch.float64)
    x = x.to(torch.float64)
    for i, name in enumerate(families):  # loop over kernel families, not tasks
        idx = (family == i).nonzero().squeeze(-1)
        if idx.numel():
            ls = lengthscale[idx]
            if name == "periodic" and periodic_lengthscale is not None:
                ls = torch.full_like(ls, periodic_lengthscale)
            with torch.no_grad():
                out[idx] = kernel(name, ls, period[idx]).forward(x[idx], x[idx])
    return out


def jittered_cholesky(cov: Tensor, jitter: float, tries: int = 4) -> tuple[Tensor, Tensor]:
    """Cholesky factor of ``cov + jitter I`` ``[B, N, N]``, and that jittered matrix; the jitter grows
    tenfold (for the whole batch) if a factorisation fails."""
    # Not linear_operator's psd_safe_cholesky: it does not return the jitter it adds (the oracle log-likelihood needs
    # the matrix factorised), and it is slower when the jitter must grow (benchmarks/library_speed.py).
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype)
    for _ in range(tries):
        jittered = cov + jitter * eye
        chol, info = torch.linalg.cholesky_ex(jittered)
        if not info.any():
            return chol, jittered
        jitter *= 10.0
    raise RuntimeError(f"Cholesky failed even with jitter {jitter / 10:g}; the covariance is not positive definite.")


def posterior_predictive(
    k_cc: Tensor, k_tc: Tensor, k_tt: Tensor, y_c: Tensor, mask_c: Tensor, noise_var: float
) -> tuple[Tensor, Tensor]:
    """Exact GP posterior predictive mean and variance of noisy observations at the targets, ``[B, T]`` each (float64).

    ``k_cc [B, C, C]``, ``k_tc [B, T, C]``, ``k_tt [B, T]`` (the diagonal) are noise-free covariances, ``y_c [B, C]``
    noisy observations with noise variance ``noise_var``. Padded context points (``mask_c`` False) are removed by
    zeroing their covariances and putting 1 on their diagonal; an empty context gives the prior.
    """
    k_cc, k_tc, k_tt, y_c = (t.to(torch.float64) for t in (k_cc, k_tc, k_tt, y_c))
    m = mask_c.to(torch.float64)
    var = k_tt + noise_var
    mean = torch.zeros_like(k_tt)
    if k_cc.shape[-1] > 0:
        cov = k_cc * m[:, :, None] * m[:, None, :] + torch.diag_embed(noise_var * m + (1.0 - m))
        chol = torch.linalg.cholesky(cov)
        v = torch.linalg.solve_triangular(chol, (k_tc * m[:, None, :]).transpose(-1, -2), upper=False)  # [B, C, T]
        alpha = torch.linalg.solve_triangular(chol, (y_c * m)[..., None], upper=False)  # [B, C, 1]
        mean = (v * alpha).sum(-2)
        var = (var - v.square().sum(-2)).clamp_min(1e-12)
    return mean, var


def predictive_loglik(
    k_cc: Tensor,
    k_tc: Tensor,
    k_tt: Tensor,
    y_c: Tensor,
    mask_c: Tensor,
    y_t: Tensor,
    mask_t: Tensor,
    noise_var: float,
) -> Tensor:
    """Mean over valid targets of the exact GP posterior predictive marginal log-density ``[B]``.

    Arguments as :func:`posterior_predictive`, plus the noisy target observations ``y_t [B, T]`` and ``mask_t``.
    """
    mean, var = posterior_predictive(k_cc, k_tc, k_tt, y_c, mask_c, noise_var)
    logp = -0.5 * (torch.log(2 * math.pi * var) + (y_t.to(torch.float64) - mean).square() / var)
    valid = mask_t.to(torch.float64)
    return (logp * valid).sum(-1) / valid.sum(-1).clamp_min(1.0)


def joint_predictive_loglik(cov: Tensor, y: Tensor, mask_c: Tensor, noise_var: float) -> Tensor:
    """:func:`predictive_loglik` ``[B]`` (float32) from the joint covariance ``[B, C + T, C + T]`` of context then
    target points, observations ``y [B, C + T]`` and the context mask ``[B, C]``; every target is real."""
    nc = mask_c.shape[1]
    mask_t = torch.ones(y.shape[0], y.shape[1] - nc, dtype=torch.bool)
    k_tt = cov[:, nc:, nc:].diagonal(dim1=-2, dim2=-1)
    return predictive_loglik(
        cov[:, :nc, :nc], cov[:, nc:, :nc], k_tt, y[:, :nc], mask_c, y[:, nc:], mask_t, noise_var
    ).float()


class SKIGrid:
    """SE-kernel GP fields on a ``G x G`` Kronecker grid over a square domain, cubically interpolated to points.

    The grid covariance is ``K ⊗ K`` with ``K [G, G]`` the 1-D SE kernel matrix (plus jitter), so a field is
    ``L E L^T`` with ``L = chol(K)`` and ``E [B, G, G]`` white noise: O(G^3) instead of a Cholesky of the
    ``G^2 x G^2`` matrix. Points are interpolated with Keys' cubic convolution (a = -0.5, Catmull-Rom), so the
    field at a point is ``sum_ij w_i(x1) w_j(x2) F[i, j]`` and the covariance of two points is the
    product over dimensions of ``w(x) K w(x')^T``.
    """

    def __init__(self, domain: tuple[float, float], size: int, lengthscale: float, jitter: float = 1e-6) -> None:
        low, high = domain
        self.size = size
        self.step = (high - low) / (size - 1 - 2 * SKI_MARGIN)
        self.start = low - SKI_MARGIN * self.step
        nodes = self.start + self.step * torch.arange(size, dtype=torch.float64)
        se = kernel("se", torch.tensor([lengthscale]))
        with torch.no_grad():
            cov = se.forward(nodes[None, :, None], nodes[None, :, None])
        chol, cov = jittered_cholesky(cov, jitter)
        self.nodes = nodes
        self.node_cov = cov[0]  # [G, G] float64
        self.chol = chol[0].float()  # [G, G]

    def sample(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Independent GP fields at the grid nodes ``[B, G, G]``; ``F[b, i, j] = f_b(node_i, node_j)``."""
        e = torch.randn(batch_size, self.size, self.size, generator=generator)
        return self.chol @ e @ self.chol.T

    def stencil(self, coord: Tensor) -> tuple[Tensor, Tensor]:
        """Grid indices ``[..., 4]`` and cubic weights ``[..., 4]`` interpolating at coordinates ``[...]``."""
        u = (coord - self.start) / self.step
        first = u.floor().clamp(1, self.size - 3)
        s = (u - first)[..., None] - torch.arange(-1, 3, dtype=u.dtype)  # offsets to the 4 nodes
        s = s.abs()
        a = -0.5
        near = ((a + 2) * s - (a + 3)) * s * s + 1
        far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
        weight = torch.where(s <= 1, near, torch.where(s < 2, far, torch.zeros_like(s)))
        index = first.long()[..., None] + torch.arange(-1, 3)
        return index, weight

    def interpolate(self, field: Tensor, x: Tensor) -> Tensor:
        """Values ``[B, N]`` of fields ``[B, G, G]`` at points ``x [B, N, 2]``."""
        b, n = x.shape[:2]
        i1, w1 = self.stencil(x[..., 0])
        i2, w2 = self.stencil(x[..., 1])
        flat = (i1[..., :, None] * self.size + i2[..., None, :]).reshape(b, n * 16)
        values = field.reshape(b, -1).gather(1, flat).reshape(b, n, 4, 4)
        return torch.einsum("bnij,bni,bnj->bn", values, w1.to(field.dtype), w2.to(field.dtype))

    def covariance(self, x1: Tensor, x2: Tensor) -> Tensor:
        """Exact covariance ``[B, N, M]`` of interpolated fields at ``x1 [B, N, 2]`` and ``x2 [B, M, 2]`` (float64)."""
        out = None
        for d in range(x1.shape[-1]):
            w1, w2 = self._dense_weights(x1[..., d]), self._dense_weights(x2[..., d])
            term = w1 @ self.node_cov @ w2.transpose(-1, -2)
            out = term if out is None else out * term
        return out

    def _dense_weights(self, coord: Tensor) -> Tensor:
        """Interpolation matrix ``[B, N, G]`` (float64) for coordinates ``[B, N]``."""
        index, weight = self.stencil(coord.to(torch.float64))
        dense = torch.zeros(*coord.shape, self.size, dtype=torch.float64)
        return dense.scatter_add_(-1, index, weight)
