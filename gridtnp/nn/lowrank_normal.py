"""``LowRankNormal``: a Gaussian over all targets of a task with a low-rank-plus-diagonal covariance.

Per task the targets' values ``y [N, Dy]``, flattened to ``K = N Dy`` components, are jointly
``N(mean, W W^T + diag(d))`` with a factor ``W [K, R]`` and a diagonal variance ``d [K]``. It subclasses
``torch.distributions.Normal`` with the marginals (``loc = mean``, ``scale = sqrt(d + sum_r W^2)``), so every
per-point metric and plot reads it as the independent Gaussian of its marginals, and adds the joint density
(``joint_log_prob``: Woodbury identity and matrix determinant lemma, O(K R^2)) and joint samples (``draw``).
Padded targets are removed exactly: their factor rows are zeroed and their diagonal set to 1, so they add nothing
to the quadratic form or the log-determinant, and their ``log(2 pi)`` constant is not counted.

``objective`` (the training loss's) has the value of the joint log-density; with ``mean_gradient="marginal"`` its
gradient reaches the mean only through the marginal densities (weighted least squares) and the covariance only
through the joint density at the fixed mean. Both parts are proper (maximised by the true mean and covariance), and
the mean learns as fast as an independent Gaussian's: with the joint gradient, a smooth error of the mean is
explained as correlated noise by the low-rank part, which slows the mean's fit. ``mean_gradient="marginals"`` also
fits each marginal standard deviation by its marginal density, and the correlations (the covariance divided by the
marginal scales) by the joint density at the fixed mean and scales: the joint density is the marginals' times the
Gaussian copula's, so the marginals are trained as an independent Gaussian's and the copula adds the correlations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributions import Normal

_LOG_2PI = math.log(2 * math.pi)

#: What trains the mean (and with ``marginals`` the marginal scales): see the module's docstring.
MEAN_GRADIENTS = ("joint", "marginal", "marginals")


class LowRankNormal(Normal):
    """Joint Gaussian over a task's targets: ``loc, diag [B, N, Dy]`` (mean, diagonal variance), ``factor
    [B, N, Dy, R]``; its ``Normal`` parameters are the marginals."""

    def __init__(self, loc: Tensor, factor: Tensor, diag: Tensor, mean_gradient: str = "joint") -> None:
        if mean_gradient not in MEAN_GRADIENTS:
            raise ValueError(f"mean_gradient must be one of {', '.join(MEAN_GRADIENTS)}; got {mean_gradient!r}.")
        self.factor, self.diag, self.mean_gradient = factor, diag, mean_gradient
        super().__init__(loc, (diag + factor.square().sum(-1)).sqrt())

    @property
    def rank(self) -> int:
        return self.factor.shape[-1]

    def rescaled(self, loc: Tensor, scale: Tensor | None = None) -> LowRankNormal:
        """The joint predictive of ``loc + (y - mean) * scale``: mean ``loc [B, N, Dy]``, each component's
        deviation times ``scale`` (broadcastable to ``[B, N, Dy]``; the covariance becomes ``S C S``)."""
        if scale is None:
            return LowRankNormal(loc, self.factor, self.diag, self.mean_gradient)
        scale = scale.to(self.diag.dtype).expand_as(self.diag)
        return LowRankNormal(loc, self.factor * scale.unsqueeze(-1), self.diag * scale.square(), self.mean_gradient)

    def _masked(self, y: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Residual ``[B, K]``, factor ``[B, K, R]``, diagonal ``[B, K]`` with padded components removed."""
        b = mask.shape[0]
        keep = mask.unsqueeze(-1).expand_as(self.loc)
        y = torch.where(keep, y.float(), self.loc.detach())  # padded / NaN y never reach the sums
        residual = torch.where(keep, y - self.loc, 0.0).reshape(b, -1)
        factor = torch.where(keep.unsqueeze(-1), self.factor, 0.0).reshape(b, -1, self.rank)
        diag = torch.where(keep, self.diag, 1.0).reshape(b, -1)
        return residual, factor, diag

    def joint_log_prob(self, y: Tensor, mask: Tensor) -> Tensor:
        """Joint log-density ``[B]`` of the valid targets' ``y [B, N, Dy]`` (``mask [B, N]``, True: a real target)."""
        with torch.autocast(self.loc.device.type, enabled=False):  # float32 under bf16 autocast too
            return self._joint_log_prob(y, mask)

    def _joint_log_prob(self, y: Tensor, mask: Tensor) -> Tensor:
        residual, factor, diag = self._masked(y, mask)
        scaled = factor / diag.unsqueeze(-1)  # D^-1 W  [B, K, R]
        eye = torch.eye(self.rank, device=diag.device, dtype=diag.dtype)
        capacitance = eye + factor.transpose(-1, -2) @ scaled  # I + W^T D^-1 W  [B, R, R]
        chol = torch.linalg.cholesky(capacitance)
        projected = (scaled.transpose(-1, -2) @ residual.unsqueeze(-1)).squeeze(-1)  # W^T D^-1 r  [B, R]
        solved = torch.linalg.solve_triangular(chol, projected.unsqueeze(-1), upper=False).squeeze(-1)
        quadratic = (residual.square() / diag).sum(-1) - solved.square().sum(-1)
        log_det = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1) + diag.log().sum(-1)
        count = mask.sum(-1) * self.loc.shape[-1]
        return -0.5 * (quadratic + log_det + count * _LOG_2PI)

    def objective(self, y: Tensor, mask: Tensor) -> Tensor:
        """The joint log-density ``[B]`` as a training objective: its value, with the gradient ``mean_gradient``
        says (see the module)."""
        if self.mean_gradient == "joint" or not torch.is_grad_enabled():
            return self.joint_log_prob(y, mask)
        factor, diag, scale = self.factor, self.diag, self.scale.detach()
        if self.mean_gradient == "marginals":  # the correlations' parts at the fixed scales: values unchanged
            ratio = scale / self.scale
            factor, diag, scale = factor * ratio.unsqueeze(-1), diag * ratio.square(), self.scale
        joint = LowRankNormal(self.loc.detach(), factor, diag).joint_log_prob(y, mask)
        keep = mask.unsqueeze(-1).expand_as(self.loc)
        y = torch.where(keep, y.float(), self.loc.detach())
        marginal = torch.where(keep, Normal(self.loc, scale).log_prob(y), 0.0).sum((-2, -1))
        return joint + marginal - marginal.detach()

    def covariance(self, mask: Tensor | None = None) -> Tensor:
        """Dense covariance ``[B, K, K]`` of the flattened components (padded ones: identity rows), for tests."""
        mask = torch.ones(self.loc.shape[:2], dtype=torch.bool, device=self.loc.device) if mask is None else mask
        _, factor, diag = self._masked(self.loc, mask)
        return factor @ factor.transpose(-1, -2) + torch.diag_embed(diag)

    def draw(self, num: int, generator: torch.Generator | None = None) -> Tensor:
        """``num`` joint samples ``[num, B, N, Dy]`` (no gradient)."""
        with torch.no_grad():
            shape = (num, *self.factor.shape[:-1])
            kw = {"device": self.loc.device, "dtype": self.loc.dtype, "generator": generator}
            common = torch.randn(num, self.factor.shape[0], 1, 1, self.rank, **kw)
            common = (self.factor * common).sum(-1)  # the low-rank part, shared by all targets of a task
            return self.loc + common + self.diag.sqrt() * torch.randn(shape, **kw)


def draw_samples(dist: Normal, num: int, generator: torch.Generator | None = None) -> Tensor:
    """``num`` samples ``[num, B, N, Dy]`` of a predictive: joint for a ``LowRankNormal``, else independent."""
    if isinstance(dist, LowRankNormal):
        return dist.draw(num, generator)
    with torch.no_grad():
        noise = torch.randn((num, *dist.loc.shape), device=dist.loc.device, dtype=dist.loc.dtype, generator=generator)
        return dist.loc + dist.scale * noise


def concatenate(parts: Sequence[Normal]) -> Normal:
    """Predictives of consecutive target chunks ``[B, N_i, Dy]`` joined along the targets: exact for a
    ``LowRankNormal`` too, as each target's factor row depends on that target alone."""
    if all(isinstance(p, LowRankNormal) for p in parts):
        joined = (torch.cat([getattr(p, k) for p in parts], 1) for k in ("loc", "factor", "diag"))
        return LowRankNormal(*joined, parts[0].mean_gradient)
    return Normal(torch.cat([p.mean for p in parts], 1), torch.cat([p.stddev for p in parts], 1))


def rescaled(dist: Normal, loc: Tensor, scale: Tensor | None = None) -> Normal:
    """``dist`` with mean ``loc`` and its std (its covariance's square root) times ``scale``; joint kept."""
    if isinstance(dist, LowRankNormal):
        return dist.rescaled(loc, scale)
    return Normal(loc, dist.scale if scale is None else dist.scale * scale.to(dist.scale.dtype))


__all__ = ["LowRankNormal", "concatenate", "draw_samples", "rescaled"]
