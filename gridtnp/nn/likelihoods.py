"""Likelihoods: target tokens ``[B, N, D]`` -> a predictive ``torch.distributions`` object ``[B, N, Dy]``.

The head runs in the model's dtype; the variance and every log-density are computed in float32,
so bf16 autocast never rounds a log-likelihood.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Normal

from gridtnp.nn.lowrank_normal import MEAN_GRADIENTS, LowRankNormal
from gridtnp.nn.mlp import mlp
from gridtnp.registry import register


@register("likelihood", "gaussian")
class GaussianLikelihood(nn.Module):
    """Heteroscedastic Gaussian ``[B, N, D] -> [B, N, Dy]``: MLP, std ``sqrt(softplus(raw) + min_noise) + min_std``.

    The default head has two hidden layers, as the TE-TNP paper's decoder MLP (``layers: 2`` for one).
    ``min_noise`` floors the variance; ``min_std`` is the gridded TNP paper's eq. 14 (``sigma_min`` added to the
    standard deviation, as the authors' code does): the same floor for ``min_std ** 2 = min_noise``, but another
    mapping from the head's output, so another optimisation landscape.

    Args:
        dim: token width D of the target tokens.
        dim_y: output dimension Dy (the head outputs a mean and a raw variance for each).
        hidden: hidden width of the MLP head; null for ``dim``.
        layers: number of linear layers of the MLP head (``layers - 1`` hidden layers; 3 as in the TE-TNP paper).
        min_noise: lower bound on the predictive variance (a variance, not a standard deviation); >= 0.
        min_std: added to the predictive standard deviation (eq. 14's ``sigma_min``); >= 0.
    """

    def __init__(
        self,
        dim: int = 128,
        dim_y: int = 1,
        hidden: int | None = None,
        layers: int = 3,
        min_noise: float = 1e-4,
        min_std: float = 0.0,
    ) -> None:
        super().__init__()
        if min_noise < 0 or min_std < 0:
            raise ValueError(f"gaussian likelihood: min_noise and min_std must be >= 0; got {min_noise}, {min_std}.")
        self.head = mlp(dim, 2 * dim_y, hidden or dim, layers)
        self.min_noise, self.min_std = min_noise, min_std

    def forward(self, z: Tensor) -> Normal:
        mean, raw = self.head(z).float().chunk(2, dim=-1)
        return Normal(mean, (F.softplus(raw) + self.min_noise).sqrt() + self.min_std)


@register("likelihood", "homoscedastic")
class HomoscedasticLikelihood(nn.Module):
    """Gaussian with an MLP mean and one learned noise variance per output dimension.

    The variance is ``softplus(raw) + min_noise``, with ``raw`` a parameter per output dimension that does not depend
    on the input.

    Args:
        dim: token width D of the target tokens.
        dim_y: output dimension Dy (one mean and one noise variance for each).
        hidden: hidden width of the MLP mean; null for ``dim``.
        layers: number of linear layers of the MLP mean (``layers - 1`` hidden layers).
        init_noise: starting noise variance of every output dimension (at least ``min_noise + 1e-6``).
        min_noise: lower bound on the noise variance (a variance, not a standard deviation).
    """

    def __init__(
        self,
        dim: int = 128,
        dim_y: int = 1,
        hidden: int | None = None,
        layers: int = 2,
        init_noise: float = 0.1,
        min_noise: float = 1e-4,
    ) -> None:
        super().__init__()
        if min_noise < 0:
            raise ValueError(f"homoscedastic likelihood: min_noise must be >= 0; got {min_noise}.")
        self.head = mlp(dim, dim_y, hidden or dim, layers)
        # softplus^-1(init_noise - min_noise)
        raw = torch.log(torch.expm1(torch.tensor(max(init_noise - min_noise, 1e-6))))
        self.raw_noise = nn.Parameter(raw.repeat(dim_y))
        self.min_noise = min_noise

    def forward(self, z: Tensor) -> Normal:
        mean = self.head(z).float()
        var = F.softplus(self.raw_noise.float()) + self.min_noise
        return Normal(mean, var.sqrt().expand_as(mean))


@register("likelihood", "direct")
class DirectLikelihood(nn.Module):
    """Gaussian read off the tokens: ``z [B, N, 2 Dy]`` = (mean, log variance) -> ``Normal [B, N, Dy]``, no parameters.

    For grid decoders that output the predictive themselves (``mos``, ``mos_kriging``). The variance is
    ``exp(log variance) + min_noise``.

    Args:
        dim: token width D of the target tokens; must be ``2 dim_y``.
        dim_y: output dimension Dy.
        min_noise: lower bound on the predictive variance (a variance, not a standard deviation); >= 0.
    """

    def __init__(self, dim: int = 2, dim_y: int = 1, min_noise: float = 1e-6) -> None:
        super().__init__()
        if dim != 2 * dim_y or min_noise < 0:
            raise ValueError(
                f"direct likelihood: needs dim = 2 dim_y (mean and log variance) and min_noise >= 0; got dim {dim}, "
                f"dim_y {dim_y}, min_noise {min_noise}."
            )
        self.min_noise = min_noise

    def forward(self, z: Tensor) -> Normal:
        mean, log_var = z.float().chunk(2, dim=-1)
        return Normal(mean, (log_var.clamp(max=60.0).exp() + self.min_noise).sqrt())


@register("likelihood", "lowrank_gaussian")
class LowRankGaussianLikelihood(nn.Module):
    """Joint Gaussian over a task's targets ``[B, N, D] -> LowRankNormal [B, N, Dy]``: covariance ``W W^T + diag``.

    An MLP head gives each target its mean, a diagonal variance ``softplus(raw) + min_noise`` and a factor row
    ``[Dy, rank]`` (scaled by ``1 / sqrt(rank)``); two targets covary by the dot product of their rows, so a
    sample of all targets is coherent (``gridtnp.nn.lowrank_normal``). Trained by the task's joint log-density,
    reported per target point as the independent Gaussian's. Not with ``kriging`` (its layer is per point).
    ``mean_gradient: marginal`` (default) fits the mean by the marginal densities and the covariance by the joint
    one at that mean (``LowRankNormal.objective``; the loss's value is the joint log-density either way);
    ``marginals`` fits the marginal standard deviations by the marginal densities too, and the joint density trains
    the correlations only, so the marginals learn as the independent ``gaussian``'s do.

    Args:
        dim: token width D of the target tokens.
        dim_y: output dimension Dy.
        rank: columns R of the covariance factor (the joint part's rank).
        hidden: hidden width of the MLP head; null for ``dim``.
        layers: number of linear layers of the MLP head.
        min_noise: lower bound on the diagonal variance; > 0 (it keeps the covariance invertible).
        mean_gradient: ``marginal``, ``marginals`` or ``joint``: what trains the mean (and the scales; see above).
    """

    joint = True

    def __init__(
        self,
        dim: int = 128,
        dim_y: int = 1,
        rank: int = 16,
        hidden: int | None = None,
        layers: int = 3,
        min_noise: float = 1e-4,
        mean_gradient: str = "marginal",
    ) -> None:
        super().__init__()
        if mean_gradient not in MEAN_GRADIENTS:
            raise ValueError(
                f"lowrank_gaussian: mean_gradient must be one of {', '.join(MEAN_GRADIENTS)}; got {mean_gradient!r}."
            )
        if rank < 1 or min_noise <= 0:
            raise ValueError(f"lowrank_gaussian likelihood: needs rank >= 1 and min_noise > 0; got {rank}, {min_noise}")
        self.head = mlp(dim, dim_y * (2 + rank), hidden or dim, layers)
        self.dim_y, self.rank, self.min_noise, self.mean_gradient = dim_y, rank, min_noise, mean_gradient

    def forward(self, z: Tensor) -> LowRankNormal:
        out = self.head(z).float()
        mean, raw = out[..., : 2 * self.dim_y].chunk(2, dim=-1)
        factor = out[..., 2 * self.dim_y :].unflatten(-1, (self.dim_y, self.rank)) / self.rank**0.5
        return LowRankNormal(mean, factor, F.softplus(raw) + self.min_noise, self.mean_gradient)


def log_likelihood(dist: Normal, y: Tensor, mask: Tensor) -> Tensor:
    """Mean log-density per valid target point, per task: ``y [B, N, Dy]``, ``mask [B, N]`` -> ``[B]``.

    Densities are summed over ``Dy``; a task with no valid target gives 0. A ``LowRankNormal`` gives its joint
    log-density over the task's valid targets divided by their number (the sum of the marginals' for a diagonal
    covariance).
    """
    if isinstance(dist, LowRankNormal):
        return dist.objective(y, mask) / mask.sum(-1).clamp(min=1)
    y = torch.where(mask.unsqueeze(-1), y.float(), dist.mean.detach())  # padded / NaN y never reach log_prob
    logp = dist.log_prob(y).sum(-1) * mask
    return logp.sum(-1) / mask.sum(-1).clamp(min=1)


__all__ = [
    "DirectLikelihood",
    "GaussianLikelihood",
    "HomoscedasticLikelihood",
    "LowRankGaussianLikelihood",
    "log_likelihood",
]
