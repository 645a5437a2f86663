"""Kriging of the network's residuals: a closed-form GP layer on top of the predictive.

``kriging: {name: gp, source: stations, grid: {...}}`` in a model's spec conditions the network's Gaussian
predictive on what one context source observed, as residual kriging (optimal interpolation) corrects a background
field with the observations' departures from it. The network predicts ``N(m(x), s(x)^2)`` at the targets and at the
source's context points; the standardised departures ``r_j = (y_j - m(x_j)) / s(x_j)`` of the context points are
taken as a Gaussian process with a learned correlation ``c(x, x')`` and a nugget ``nu`` (observation noise), and each
target gets the GP's posterior (eqs. 2.25-2.26 of Rasmussen and Williams, 2006, on the standardised scale)::

    mean(x) = m(x) + s(x) c(x, X) (C + nu I)^-1 r
    var(x)  = s(x)^2 (1 + nu - c(x, X) (C + nu I)^-1 c(X, x))

The correlation is what a meteorologist would estimate from the stations' past errors, made a function of place:
``c = k / sqrt(k(x, x) k(x', x'))`` with ``k(x, x') = exp(-|x - x'|^2 / (2 L^2)) phi(x) . phi(x') / R + a^2
exp(-|x - x'|^2 / (2 l^2))``, ``phi`` a learned field of ``R`` features over a lattice of places
(``LearnedGridEmbedding``) and ``L`` (a taper), ``a`` and ``l`` learned. Places that err together (two valleys under
the same inversion, two stretches of one coast) get similar features, whatever the distance between them; the
second term is the short-range part that any two nearby places share. Targets are conditionally independent given
the context as before (the predictive is a Normal per target), so predicting in chunks is unchanged.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.distributions import Normal

from gridtnp.nn.conditioning import Factor, condition, posterior
from gridtnp.nn.embeddings import LearnedGridEmbedding
from gridtnp.nn.gaussian import exp_floored
from gridtnp.registry import register

WHERE = "kriging 'gp'"  # how error messages name this component


class Conditioned(NamedTuple):
    """What ``ResidualKriging.condition`` keeps of one batch's context points for ``ResidualKriging.forward``."""

    x: Tensor  # context locations [B, Nc, Dx]
    features: Tensor  # phi at the context points [B, Nc, R]
    norm: Tensor  # k(x, x)^-1/2 at the context points [B, Nc]
    factor: Factor  # C + nu I factored, and the standardised departures solved (conditioning.condition)


@register("kriging", "gp")
class ResidualKriging(nn.Module):
    """A closed-form GP layer: the predictive ``[B, Nt, Dy]`` conditioned on one context source's departures from it.

    The formulas are in the module's docstring; ``condition`` factors the context once, ``forward`` applies it.

    Args:
        source: the context source whose points are kriged (its first ``Dy`` value columns are the target's
            variables in the same units, as for ``residual``).
        dim_x: input dimension Dx.
        dim_y: the targets' output dimension Dy (one correlation serves every output).
        source_dims: ``{source: Dy}`` of the model's context sources (checked against ``source``).
        grid: the lattice of ``phi`` ``{lower, upper, shape}``, in input units (the 0.25 degree points of a region).
        rank: ``R``, features per place.
        lr_scale: learning-rate multiplier of the feature table (``LearnedGridEmbedding``'s).
        scales_lr_scale: learning-rate multiplier of the four scales (``L``, ``l``, ``a^2``, ``nu``, learned on a log
            scale): at 1 and a learning rate of 1e-3, Adam moves ``nu`` by about a factor e per 1,000 steps, too
            slow for observations whose noise share is far from the initial ``nugget``.
        taper: initial ``L`` in input units; learned.
        lengthscale: initial ``l`` of the short-range part, in input units; learned.
        short_range: initial ``a^2``, the short-range part's share at initialisation against ``phi``'s ``init_std^2``.
        init_std: initial std of ``phi``'s entries.
        nugget: initial ``nu``, the share of a context point's variance that is noise; learned, above ``jitter``.
        jitter: floor of ``nu``, which keeps ``C + nu I`` positive definite in float32 (raise it for thousands of
            context points with near-duplicate locations; the error says so).
    """

    def __init__(
        self,
        source: str,
        dim_x: int,
        dim_y: int,
        source_dims: dict[str, int],
        grid: dict[str, Any] | None = None,
        rank: int = 16,
        lr_scale: float = 100.0,
        scales_lr_scale: float = 1.0,
        taper: float = 3.0,
        lengthscale: float = 0.25,
        short_range: float = 0.25,
        init_std: float = 1.0,
        nugget: float = 0.01,
        jitter: float = 1e-4,
    ) -> None:
        super().__init__()
        if source not in source_dims:
            raise ValueError(
                f"{WHERE}: source must be one of the model's context sources {sorted(source_dims)}; got {source!r}."
            )
        if source_dims[source] < dim_y:
            raise ValueError(
                f"{WHERE}: source {source!r} has {source_dims[source]} value columns, fewer than the targets' Dy = "
                f"{dim_y}."
            )
        if grid is None:
            raise ValueError(f"{WHERE} needs grid: the lattice of its place features, {{lower, upper, shape}}.")
        positive = {
            "rank": rank,
            "taper": taper,
            "lengthscale": lengthscale,
            "short_range": short_range,
            "nugget": nugget,
            "jitter": jitter,
            "scales_lr_scale": scales_lr_scale,
        }
        bad = {k: v for k, v in positive.items() if not v > 0}
        if bad or nugget <= jitter:
            raise ValueError(
                f"{WHERE} needs rank, taper, lengthscale, short_range, jitter, scales_lr_scale > 0 and nugget > "
                f"jitter; got {bad or {'nugget': nugget, 'jitter': jitter}}."
            )
        self.source, self.dim_y, self.rank, self.jitter = source, dim_y, int(rank), float(jitter)
        self.features = LearnedGridEmbedding(dim_x, grid, self.rank, init_std=init_std, lr_scale=lr_scale)
        # log L, log l, log a^2 and log(nu - jitter), stored divided by scales_lr_scale (Adam's step is in stored units)
        scales = [math.log(taper), math.log(lengthscale), math.log(short_range), math.log(nugget - jitter)]
        self.scales_lr_scale = float(scales_lr_scale)
        self.log_scales = nn.Parameter(torch.tensor(scales) / self.scales_lr_scale)

    def scales(self) -> Tensor:
        """``[4]``: log L, log l, log a^2 and log(nu - jitter)."""
        return self.log_scales * self.scales_lr_scale

    @property
    def nugget(self) -> Tensor:
        """``nu``, the noise share of a context point's variance (a scalar tensor)."""
        return self.scales()[3].exp() + self.jitter

    def _kernel(self, xa: Tensor, fa: Tensor, xb: Tensor, fb: Tensor) -> Tensor:
        """``k(xa, xb)`` ``[B, Na, Nb]`` from locations ``[B, N, Dx]`` and features ``[B, N, R]``."""
        log_taper, log_l, log_a2, _ = self.scales().unbind()
        d2 = torch.cdist(xa, xb, compute_mode="donot_use_mm_for_euclid_dist").square()
        shared = fa @ fb.transpose(1, 2) / self.rank
        # Two factors in the first term: each floored so that their product stays a normal float.
        taper = exp_floored(-0.5 * d2 * torch.exp(-2 * log_taper), factors=2)
        return taper * shared + exp_floored(log_a2 - 0.5 * d2 * torch.exp(-2 * log_l))

    def _self_kernel(self, f: Tensor) -> Tensor:
        """``k(x, x)`` ``[B, N]``."""
        return f.square().sum(-1) / self.rank + self.scales()[2].exp()

    def condition(self, xc: Tensor, yc: Tensor, valid: Tensor, context: Normal) -> Conditioned:
        """Factor ``C + nu I`` and solve for the standardised departures of the context points ``xc [B, Nc, Dx]``
        (values ``yc [B, Nc, >= Dy]``, mask ``valid [B, Nc]``) under the network's predictive there ``[B, Nc, Dy]``."""
        dtype = torch.promote_types(context.mean.dtype, torch.float32)  # never solve in bf16
        with torch.autocast(xc.device.type, enabled=False):
            xc = xc.to(dtype)
            f = self.features(xc).to(dtype)  # [B, Nc, R]
            norm = self._self_kernel(f).rsqrt()
            corr = self._kernel(xc, f, xc, f) * norm.unsqueeze(-1) * norm.unsqueeze(-2)
            r = (yc[..., : self.dim_y].to(dtype) - context.mean.to(dtype)) / context.stddev.to(dtype)
            factor = condition(corr, r, valid, self.nugget, WHERE, f"raise jitter (now {self.jitter})")
        return Conditioned(xc, f, norm, factor)

    def forward(self, conditioned: Conditioned, xt: Tensor, dist: Normal) -> Normal:
        """The network's predictive ``dist`` at ``xt [B, Nt, Dx]`` conditioned on the context (``condition``)."""
        dtype = conditioned.factor.weights.dtype
        with torch.autocast(xt.device.type, enabled=False):
            xt = xt.to(dtype)
            f = self.features(xt).to(dtype)  # [B, Nt, R]
            cross = self._kernel(xt, f, conditioned.x, conditioned.features)  # [B, Nt, Nc]
            cross = cross * self._self_kernel(f).rsqrt().unsqueeze(-1) * conditioned.norm.unsqueeze(-2)
            shift, explained = posterior(conditioned.factor, cross)  # [B, Nt, Dy], [B, Nt]
            explained = explained.clamp(max=1.0)
            std = dist.stddev.to(dtype)
            mean = dist.mean.to(dtype) + std * shift
            var = std.square() * (1.0 + self.nugget - explained).unsqueeze(-1)
        return Normal(mean.to(dist.mean.dtype), var.sqrt().to(dist.mean.dtype))
