"""Residual prediction: the predictive mean as an interpolation of the context values plus what the network adds.

``residual: {sources: [grid], k: 4}`` in a model's spec makes the network predict the departure of the target from
a kernel-weighted mean of the ``k`` nearest context values of the named sources (``ContextInterpolation``), as
statistical downscaling predicts a station's departure from the coarse field, and super-resolution networks the
residual over an interpolated image. The interpolation is exact where a target coincides with a context point of a
listed source (for a lengthscale well below the point spacing), so observed values come back unless the network
learns otherwise, and the network's output only has to carry the sub-grid part. Listed sources must hold the
target's variable(s) in the same normalised units, in their first ``Dy`` value columns (the gridded and station
sources of ``StationReanalysisDataModule`` do, extra time-feature columns come after).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributions import Distribution, Normal

from gridtnp.nn.neighbours import knn_points


class ContextInterpolation(nn.Module):
    """Gaussian-weighted mean of each target's nearest context values: ``xt [B, Nt, Dx] -> [B, Nt, Dy]``.

    Weights ``softmax_j(log w_s - |xt - xc_j|^2 / (2 l_s^2))`` over the ``k`` nearest valid points of each listed
    source (Euclidean distance in input units), ``s`` the source of point ``j``, each source with its own learned
    lengthscale ``l_s`` and prior weight ``w_s``: a dense, exact source (stations) can win near its points with a
    short lengthscale and a large weight, and give way to the coarse field elsewhere. A target with no valid context
    point gets 0 (the normalised mean).

    Args:
        sources: context sources to interpolate (their values' first ``dim_y`` columns).
        dim_y: the targets' output dimension Dy.
        source_dims: ``{source: Dy}`` of the model's context sources (checked against ``sources``).
        k: nearest context points per target and source.
        lengthscale: initial ``l_s`` in input units, one for all sources or ``{source: l}``; learned.
        weight: initial ``w_s > 0``, one for all sources or ``{source: w}``; learned.
        dim: the target tokens' width D: the sources' weight shares ``[B, Nt, S]`` are embedded (a linear map,
            zero at initialisation) and added to the target tokens, so the network knows where the interpolation
            rests on an observation at the target (a context station: it should predict a small departure and a
            small std) and where on the coarse field.
    """

    def __init__(
        self,
        sources: Sequence[str],
        dim_y: int,
        source_dims: dict[str, int],
        k: int = 4,
        lengthscale: float | dict[str, float] = 1.0,
        weight: float | dict[str, float] = 1.0,
        dim: int = 128,
    ) -> None:
        super().__init__()
        sources = [sources] if isinstance(sources, str) else list(sources)
        unknown = [s for s in sources if s not in source_dims]
        if not sources or unknown:
            raise ValueError(
                f"residual: sources must be a non-empty list of the model's context sources {sorted(source_dims)}; "
                f"got {sources!r}."
            )
        narrow = {s: source_dims[s] for s in sources if source_dims[s] < dim_y}
        if narrow:
            raise ValueError(f"residual: sources {narrow} have fewer value columns than the targets' Dy = {dim_y}.")
        if k < 1:
            raise ValueError(f"residual needs k >= 1; got k = {k}.")
        self.sources, self.dim_y, self.k = sources, dim_y, k
        self.lengthscale = self._per_source(lengthscale, "lengthscale")
        self.weight = self._per_source(weight, "weight")
        self.log_lengthscale = nn.Parameter(torch.tensor([math.log(self.lengthscale[s]) for s in sources]))
        self.log_weight = nn.Parameter(torch.tensor([math.log(self.weight[s]) for s in sources]))
        self.features = nn.Linear(len(sources), dim)
        nn.init.zeros_(self.features.weight)
        nn.init.zeros_(self.features.bias)

    def _per_source(self, value: float | dict[str, float], what: str) -> dict[str, float]:
        """``{source: value}`` from one value or a mapping, each finite and > 0."""
        values = dict(value) if isinstance(value, dict) else dict.fromkeys(self.sources, value)
        if set(values) != set(self.sources):
            raise ValueError(f"residual: {what} must be one number or one per source {self.sources}; got {value!r}.")
        bad = {s: v for s, v in values.items() if not (isinstance(v, int | float) and math.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"residual: {what} must be finite and > 0; got {bad}.")
        return {s: float(v) for s, v in values.items()}

    def forward(self, context: dict[str, tuple[Tensor, Tensor, Tensor]], xt: Tensor) -> tuple[Tensor, Tensor]:
        """The interpolation ``[B, Nt, Dy]`` and each source's share of its weights ``[B, Nt, S]`` (summing to 1,
        or 0 without any neighbour). ``context``: ``{source: (x [B, N, Dx], y [B, N, Dy'], valid [B, N])}``."""
        # The k nearest of each source apart: over all sources together, near points of a dense source (stations)
        # would crowd the coarse field's points out of a target's neighbourhood and leave a worse interpolation.
        logits, values = [], []
        for i, s in enumerate(self.sources):
            xc, yc, valid = context[s][0], context[s][1][..., : self.dim_y], context[s][2]
            index, ok = knn_points(xc, valid, xt, min(self.k, xc.shape[1]))  # [B, Nt, k]
            b, nt, k = index.shape
            flat = index.reshape(b, nt * k, 1)
            xn = xc.gather(1, flat.expand(-1, -1, xc.shape[-1])).view(b, nt, k, -1)
            values.append(yc.gather(1, flat.expand(-1, -1, yc.shape[-1])).view(b, nt, k, -1))
            d2 = (xt.unsqueeze(-2) - xn).square().sum(-1)  # [B, Nt, k]
            logit = self.log_weight[i] - 0.5 * d2 * torch.exp(-2 * self.log_lengthscale[i])
            logits.append(logit.masked_fill(~ok, float("-inf")))
        weights = torch.softmax(torch.cat(logits, -1), -1).nan_to_num(0.0)  # no valid neighbour at all: zeros
        mean = (weights.unsqueeze(-1) * torch.cat(values, -2)).sum(-2)
        sizes = [logit.shape[-1] for logit in logits]  # k, or fewer for a source with fewer points
        return mean, torch.stack([w.sum(-1) for w in weights.split(sizes, -1)], -1)

    def target_features(self, share: Tensor) -> Tensor:
        """The learned embedding ``[B, Nt, D]`` of ``share [B, Nt, S]`` that the model adds to the target tokens."""
        return self.features(share.to(self.features.weight.dtype))


def shift_mean(dist: Distribution, offset: Tensor) -> Normal:
    """``dist`` (a Normal) with ``offset [B, Nt, Dy]`` added to its mean."""
    if not isinstance(dist, Normal):
        raise TypeError(f"residual needs a Gaussian likelihood (a Normal predictive); got {type(dist).__name__}.")
    return Normal(dist.loc + offset.to(dist.loc.dtype), dist.scale)
