"""The five-slot neural process: encoder -> grid encoder -> processor -> grid decoder -> likelihood.

Every model in gridtnp, gridded or not, is this module with different components in the slots; it is built from a
specification (a plain mapping, what a recipe holds) by ``gridtnp.models.specs.build_model``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Distribution, Normal

from gridtnp.batch import Observations
from gridtnp.nn.grids import Grid
from gridtnp.nn.kriging import Conditioned, ResidualKriging
from gridtnp.nn.lowrank_normal import concatenate
from gridtnp.nn.residuals import Residual, shift_mean
from gridtnp.nn.tokens import Tokens
from gridtnp.registry import ConfigError

#: Most (target, context point) pairs per batch compared to find the context points that are also targets.
MATCH_PAIRS = 2**22  # the comparison holds [B, Nc, Nt, Dx] floats: 34 MB at Dx = 2

#: Target points (summed over tasks) decoded in one pass when predicting (``forward_chunked``).
TARGET_CHUNK = 2**16


class NeuralProcess(nn.Module):
    """Context ``{source: Observations}`` and target locations ``xt [B, Nt, Dx]`` -> ``p(y_t) [B, Nt, Dy]``."""

    def __init__(
        self,
        encoders: nn.ModuleDict,
        grid_encoder: nn.Module,
        processor: nn.Module,
        grid_decoder: nn.Module,
        likelihood: nn.Module,
        dim_x: int,
        target_source: str,
        grid: Grid | None = None,
        residual: Residual | None = None,
        kriging: ResidualKriging | None = None,
        time_dims: int = 0,
    ) -> None:
        super().__init__()
        if kriging is not None and getattr(likelihood, "joint", False):
            raise ConfigError("kriging is per target: use a per-point likelihood (gaussian), not a joint one, with it.")
        self.encoders = encoders
        self.grid_encoder = grid_encoder
        self.processor = processor
        self.grid_decoder = grid_decoder
        self.likelihood = likelihood
        self.dim_x = dim_x
        self.target_source = target_source
        self.grid = grid
        self.residual = residual
        self.kriging = kriging
        # The first ``time_dims`` input dims are times (a forecast's hours from its initial hour): the encoders embed
        # them with the rest of x; the grid encoder, grid decoder and residual see the other (spatial) dims.
        self.time_dims = time_dims

    def forward(self, context: dict[str, Observations], xt: Tensor) -> Distribution:
        """Predictive distribution at ``xt [B, Nt, Dx]`` given ``context`` (padded, masked sets)."""
        self._check_inputs(context, xt)
        encoded = self._encode(context)
        if self.kriging is None or getattr(self.grid_decoder, "targets_interact", False):
            return self._predict(encoded, self._condition(encoded), xt)  # the context points must not join targets
        # Each point is decoded on its own, so the network's predictive at the kriged source's context points comes
        # from the targets' decoding where every context point is also a target (a station task), else from one
        # decoder pass over the targets and the context points together.
        xc, _, valid = self._kriged_points(encoded)
        index = _target_at_each_point(xt, xc, valid)
        if index is not None:
            dist = gaussian(self._decode(*encoded, xt), "kriging")
            at_points = Normal(*(_rows(v, index) for v in (dist.mean, dist.stddev)))
            return self._predict(encoded, self._condition(encoded, at_points), xt, dist)
        dist = gaussian(self._decode(*encoded, torch.cat([xt, xc.to(xt.dtype)], 1)), "kriging")
        n = xt.shape[1]
        conditioned = self._condition(encoded, Normal(dist.mean[:, n:], dist.stddev[:, n:]))
        return self._predict(encoded, conditioned, xt, Normal(dist.mean[:, :n], dist.stddev[:, :n]))

    def forward_chunked(self, context: dict[str, Observations], xt: Tensor, chunk: int) -> Distribution:
        """``forward`` with the targets ``xt [B, Nt, Dx]`` decoded ``chunk`` at a time: the context is encoded and
        processed once, and memory grows with ``chunk`` rather than ``Nt`` (targets are conditionally independent
        given the context, so the result equals ``forward``'s). Needs a Gaussian predictive."""
        self._check_inputs(context, xt)
        encoded = self._encode(context)
        conditioned = self._condition(encoded)
        if xt.shape[1] <= chunk:
            return self._predict(encoded, conditioned, xt)
        parts = [
            gaussian(self._predict(encoded, conditioned, xt[:, start : start + chunk]), "forward_chunked")
            for start in range(0, xt.shape[1], chunk)
        ]
        return concatenate(parts)

    def _encode(self, context: dict[str, Observations]) -> tuple[Any, Any, Any]:
        """The context's tokens, its valid observations by source and the processor's states."""
        tokens, observed = {}, {}
        for name, obs in context.items():
            # Points with a NaN or inf in x or y are missing observations: masked out, and zeroed so that
            # no NaN reaches a matmul (0 * NaN would still be NaN).
            valid = obs.mask & torch.isfinite(obs.x).all(-1) & torch.isfinite(obs.y).all(-1)
            x = torch.where(valid.unsqueeze(-1), single(obs.x), 0.0)
            y = torch.where(valid.unsqueeze(-1), single(obs.y), 0.0)
            tokens[name] = Tokens(x[..., self.time_dims :], self.encoders[name](x, y), valid)
            observed[name] = (x[..., self.time_dims :], y, valid)
        latent = self.grid_encoder(tokens)
        return tokens, observed, self.processor(latent)

    def _kriged_points(self, encoded: tuple[Any, Any, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """The kriged source's context ``(x, y, valid)``: an empty set where the context lacks that source."""
        observed = encoded[1]
        if self.kriging.source in observed:
            return observed[self.kriging.source]
        x, y, valid = next(iter(observed.values()))
        return x.new_zeros(x.shape[0], 0, x.shape[-1]), y.new_zeros(y.shape[0], 0, self.kriging.dim_y), valid[:, :0]

    def _condition(self, encoded: tuple[Any, Any, Any], at_points: Normal | None = None) -> Conditioned | None:
        """With ``kriging``: the context of the GP layer, from the network's predictive at the kriged source's points
        (``at_points``, decoded here unless given), factored once."""
        if self.kriging is None:
            return None
        xc, yc, valid = self._kriged_points(encoded)
        at_points = gaussian(self._decode(*encoded, xc) if at_points is None else at_points, "kriging")
        return self.kriging.condition(xc, yc, valid, at_points)

    def _predict(
        self,
        encoded: tuple[Any, Any, Any],
        conditioned: Conditioned | None,
        xt: Tensor,
        dist: Distribution | None = None,
    ) -> Distribution:
        """The predictive at ``xt [B, Nt, Dx]``: the network's (``dist``, decoded here unless given), kriged when the
        model has ``kriging``."""
        dist = self._decode(*encoded, xt) if dist is None else dist
        if conditioned is None:
            return dist
        return self.kriging(conditioned, finite_locations(xt), gaussian(dist, "kriging"))

    def _decode(self, tokens: Any, observed: Any, states: Any, xt: Tensor) -> Distribution:
        """The network's predictive at ``xt [B, Nt, Dx]`` from ``_encode``'s outputs."""
        # Padded target slots may hold anything; real targets with a non-finite location are refused where batches
        # are made (gridtnp.batch.Batch), without a device sync here.
        xt = finite_locations(xt)
        zt = self.encoders[self.target_source](xt, None)
        xt = xt[..., self.time_dims :]
        base = near = None
        if self.residual is not None:
            base, features, near = self.residual(observed, xt)
            zt = zt + self.residual.target_features(features).to(zt.dtype)
        if getattr(self.grid_decoder, "takes_context", False):  # a decoder with a skip connection from the context
            zt = self.grid_decoder(states, zt, xt, context=tokens)
        else:
            zt = self.grid_decoder(states, zt, xt)
        dist = self.likelihood(zt)
        if base is None:
            return dist
        if self.residual.adaptive:
            base = base + self.residual.adapt(near, zt)
        return shift_mean(dist, base, near.spread)

    def warn_outside_grid(self, context: dict[str, Observations], target: Observations) -> None:
        """Warn when targets or context lie beyond a gridded model's grid by more than half a cell: the model clamps
        such context into its edge cells and extrapolates to such targets. It syncs the device, so the prediction
        paths call it (``gridtnp predict``, ``gridtnp.inference.predict``), not the training loop."""
        grid = self.grid
        if grid is None:
            return
        x0 = target.x[..., self.time_dims :]
        lower, upper = x0.new_tensor(grid.lower), x0.new_tensor(grid.upper)
        margin, rolled = 0.5 * x0.new_tensor(grid.spacing), torch.tensor(grid.roll, device=x0.device)
        sets = [("targets", target), *((f"context {name!r}", obs) for name, obs in context.items())]
        for what, obs in sets:
            if obs.x.numel() == 0:
                continue
            x = obs.x[..., self.time_dims :]
            inside = obs.mask.unsqueeze(-1) & torch.isfinite(x)
            beyond = torch.maximum(
                torch.where(inside, lower - x, 0.0).amax(dim=(0, 1)),
                torch.where(inside, x - upper, 0.0).amax(dim=(0, 1)),
            )
            beyond = torch.where(rolled, 0.0, beyond)  # a rolled dimension (longitude) wraps: never outside
            if bool((beyond > margin).any()):
                d = int(beyond.argmax())
                warnings.warn(
                    f"{what} lie outside the model's grid along input dimension {d} by up to {float(beyond[d]):.4g} "
                    f"(grid [{grid.lower[d]}, {grid.upper[d]}]): the model extrapolates there.",
                    stacklevel=2,
                )

    def _check_inputs(self, context: dict[str, Observations], xt: Tensor) -> None:
        unknown = set(context) - set(self.encoders)
        if unknown:
            raise ValueError(
                f"context has source(s) {sorted(unknown)} that the model has no encoder for; "
                f"model sources: {sorted(self.encoders)}. Set the model's dim_y to a mapping {{source: Dy}}."
            )
        if xt.dim() != 3 or xt.shape[-1] != self.dim_x:
            raise ValueError(f"target x must be [B, Nt, Dx] with Dx = dim_x = {self.dim_x}; got {tuple(xt.shape)}.")
        for name, obs in context.items():
            if obs.x.shape[-1] != self.dim_x:
                raise ValueError(
                    f"context[{name!r}].x has Dx = {obs.x.shape[-1]} but the model was built with dim_x = {self.dim_x}."
                )
            dim_y = self.encoders[name].dim_y
            if obs.y is None or obs.y.shape[-1] != dim_y:
                got = None if obs.y is None else tuple(obs.y.shape)
                raise ValueError(f"context[{name!r}].y must be [B, N, {dim_y}] for this model; got {got}.")
            if obs.x.shape[0] != xt.shape[0]:
                raise ValueError(f"context[{name!r}] has batch size {obs.x.shape[0]} but target x has {xt.shape[0]}.")


def _target_at_each_point(xt: Tensor, xc: Tensor, valid: Tensor) -> Tensor | None:
    """Indices ``[B, Nc]`` of a target slot of ``xt [B, Nt, Dx]`` at each valid point of ``xc [B, Nc, Dx]`` (to
    float32 rounding), or None where some valid point has none or the sets are too large to compare pairwise (above
    ``MATCH_PAIRS`` pairs per batch; one device sync)."""
    if xt.shape[1] == 0 or xc.shape[1] == 0 or xt.shape[0] * xt.shape[1] * xc.shape[1] > MATCH_PAIRS:
        return None
    xt, xc = torch.nan_to_num(xt.detach().float()), xc.detach().float()
    tolerance = 1e-6 * (1.0 + xc.abs().amax(-1, keepdim=True))  # [B, Nc, 1]
    same = (xc.unsqueeze(2) - xt.unsqueeze(1)).abs().amax(-1) <= tolerance  # [B, Nc, Nt]
    if not bool((same.any(-1) | ~valid).all()):
        return None
    return same.to(torch.uint8).argmax(-1)  # the first target at each point


def _rows(values: Tensor, index: Tensor) -> Tensor:
    """``values [B, N, D]`` at the rows ``index [B, M]`` -> ``[B, M, D]``."""
    return torch.gather(values, 1, index.unsqueeze(-1).expand(-1, -1, values.shape[-1]))


def gaussian(dist: Distribution, what: str) -> Normal:
    """``dist``, checked to be the Normal that ``what`` needs."""
    if not isinstance(dist, Normal):
        raise TypeError(f"{what} needs a Gaussian likelihood (a Normal predictive); got {type(dist).__name__}.")
    return dist


def finite_locations(xt: Tensor) -> Tensor:
    """Target locations ``[B, Nt, Dx]`` in float32 (``single``) with padded slots' non-finite values set to 0."""
    return torch.nan_to_num(single(xt), nan=0.0, posinf=0.0, neginf=0.0)


def single(t: Tensor) -> Tensor:
    """float64 inputs (numpy's default) as float32, the precision the models compute in; other tensors unchanged."""
    return t.float() if t.dtype == torch.float64 else t


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
