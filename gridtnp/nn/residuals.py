"""Residual prediction: the predictive mean as an interpolation of the context values plus what the network adds.

``residual: {name: interpolation, sources: [grid], k: 4}`` in a model's spec makes the network predict the
departure of the target from a kernel-weighted mean of the ``k`` nearest context values of the named sources
(``InterpolationResidual``), as statistical downscaling predicts a station's departure from the coarse field, and
super-resolution networks the residual over an interpolated image. The interpolation is exact where a target
coincides with a context point of a listed source (for a lengthscale well below the point spacing), so observed
values come back unless the network learns otherwise, and the network's output only has to carry the sub-grid part.
Listed sources must hold the target's variable(s) in the same normalised units, in their first ``Dy`` value columns
(the gridded and station sources of ``StationReanalysisDataModule`` do, extra time-feature columns come after).

``spread: stations`` lets the day's difficulty reach the predictive std: how far the listed source's observations
stray from the interpolation of the other sources today (the sub-grid spread the coarse field misses) scales every
prediction's std, so a model trained on calm days widens its intervals on a day of sharp contrasts instead of
staying as sure as it was in training.

``regression: {sources: [grid], grid: {...}}`` adds what a per-station regression on the surrounding coarse blocks
(model output statistics, MOS) adds: a linear correction from the local shape of the coarse field around the target
(its kernel-weighted gradients and curvatures), with coefficients that are a learned field over a lattice of places,
not a function of the day's inputs, so they are fitted across all the training days' weather at each place (a
valley station colder than every block around it, a coastal one that follows its land neighbours) and cannot
follow one day's pattern into an extrapolation on another.

``departures: {source: stations, ...}`` adds what optimal interpolation and residual kriging add to a background
field: each observation's departure from the interpolation at its own location, spread to the targets with a
learned kernel that shrinks to zero away from the observations, so an observed anomaly (a station 1 K warmer than
the coarse field today) carries to its neighbours instead of only to its own location.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn
from torch.distributions import Distribution, Normal

from gridtnp.nn.conditioning import rank_one_posterior
from gridtnp.nn.embeddings import LearnedGridEmbedding
from gridtnp.nn.gaussian import exp_floored, floor_logits
from gridtnp.nn.lowrank_normal import rescaled
from gridtnp.nn.monomials import basis_size, shape_basis
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.residual_options import WHERE, Departures, Regression, number
from gridtnp.registry import register

SPREAD_PRIOR_POINTS = 4.0  # pseudo-observations at nu_0 in the spread estimate (see InterpolationResidual's spread)


class Neighbours(NamedTuple):
    """A target's neighbours in the interpolation: kernel logits ``[B, Nt, K]`` (-inf where invalid), values
    ``[B, Nt, K, Dy]``, offsets ``[B, Nt, K, Dx]`` in units of the source's lengthscale; ``sizes``: K per source;
    ``base``: the interpolation under the kernel alone ``[B, Nt, Dy]`` and ``spread``: the factor ``[B, 1, 1]`` on
    the predictive std (with ``spread``), both set by ``forward``."""

    logits: Tensor
    values: Tensor
    offsets: Tensor
    sizes: tuple[int, ...]
    base: Tensor | None = None
    spread: Tensor | None = None


class Residual(Protocol):
    """What ``NeuralProcess`` calls on a component of kind ``residual``: the base it adds the network's output to."""

    adaptive: bool  # whether ``adapt`` is called with the decoded target tokens

    def __call__(
        self, context: dict[str, tuple[Tensor, Tensor, Tensor]], xt: Tensor
    ) -> tuple[Tensor, Tensor, Neighbours]:
        """``context`` ``{source: (x, y, valid)}`` and ``xt [B, Nt, Dx]`` -> the base ``[B, Nt, Dy]``, features
        ``[B, Nt, F]`` for the target tokens, and the neighbours (``spread`` ``[B, 1, 1]`` or None scales the std)."""
        ...

    def target_features(self, features: Tensor) -> Tensor:
        """Features ``[B, Nt, F]`` -> ``[B, Nt, D]``, added to the target tokens before decoding."""
        ...

    def adapt(self, near: Neighbours, zt: Tensor) -> Tensor:
        """With ``adaptive``: the change ``[B, Nt, Dy]`` of the base given the decoded target tokens ``zt``."""
        ...


@register("residual", "interpolation")
class InterpolationResidual(nn.Module):
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
        dim: the target tokens' width D: the interpolation's features (``num_features``: the sources' weight
            shares and, with ``departures``, the departures' total weight, mean and mean square) are embedded (a
            linear map, zero at initialisation) and added to the target tokens, so the network knows where the
            interpolation rests on an observation at the target (a context station: it should predict a small
            departure and a small std), where on the coarse field, and how far nearby observations stray from it.
        adaptive: let each target reweight its neighbours by direction: after decoding, the logit of neighbour
            ``j`` gets ``c(z_t) . phi(o_j)``, with ``o_j`` the neighbour-minus-target offset in units of its
            source's lengthscale, ``phi(o) = [o, o^2]`` (per input dimension) and ``c`` a linear map of the
            decoded target token (zero at initialisation). A coastal station can lean on its land neighbours and
            a valley station on the cold side, as a per-station regression on the surrounding blocks (MOS) does,
            with coefficients the network computes for each place and hour.
        dim_x: input dimension Dx (sizes ``adaptive``'s map).
        spread: a context source (listed or not, with at least one other listed) whose points measure the day's
            sub-grid spread:
            the predictive std is multiplied by ``(nu / nu_0)^alpha``, with ``nu^2 = (sum_j d_j^2 + c nu_0^2) /
            (n + c)`` over the source's ``n`` valid points in the task, ``d_j`` their departures from the
            interpolation of the other listed sources at their own locations, ``c = SPREAD_PRIOR_POINTS`` prior
            points (a task with few or none falls back towards ``nu_0``), ``nu_0`` (initially 0.2, in normalised
            units) and ``alpha`` learned.
        spread_power: the initial ``alpha`` of ``spread``: 0 starts without effect, 1 with a std proportional to the
            day's spread.
        regression: ``{sources: [...], grid: {lower, upper, shape}, lr_scale: 30}`` (``Regression``'s fields): add
            ``sum_s a_s (c_s0(x) + sum_p c_sp(x) g_sp)`` to the mean (with ``gain``, plus ``c_sg(x) m_s``, MOS's gain
            on the field itself), a per-place linear regression on the local shape of each named source's field
            (MOS): ``g_sp = sum_j w_j phi_p(o_j) (y_j - m_s)`` over the source's neighbours ``j``, with ``w_j`` their
            kernel weights within the source, ``m_s`` its weighted mean and
            ``phi`` the offsets, their squares and products (``shape_basis``), both under the regression's own
            learned lengthscale if ``lengthscale`` (one, or one per source) is given, else under the
            interpolation's (a wider one lets the farther neighbours shape the gradients and curvatures), and
            ``a_s`` the source's weight share (so an observed station's own value is left as it is). The
            coefficients ``c(x)`` are a ``LearnedGridEmbedding`` on ``grid`` (zero at initialisation, learning rate
            times ``lr_scale``): they depend on the place only, never on the day's inputs. ``degree`` (1 to 4,
            default 2) is that of ``phi``; ``position`` (0 to 4, default 0) makes every coefficient a polynomial of
            that degree in the target's offset ``u`` from the source's nearest point, ``c_sp(x, u) = sum_q c_spq(x)
            psi_q(u)`` with ``psi = [1, shape_basis(u)]``: for a coarse field of block averages, where the target
            sits in its block, which decides which neighbouring blocks share its sub-grid features, so one table
            serves every block layout as a refitted MOS serves its own.
        departures: ``{source, k: 8, lengthscale: 0.5, weight: 1.0}`` (``Departures``' fields): add the
            departures ``d_j = y_j - m(x_j)`` of the ``k`` nearest points of ``source`` (not one of ``sources``)
            from the interpolation ``m``, weighted
            ``lambda_j = a_j / (1 + sum_i a_i)`` with ``a_j = w exp(-|xt - x_j|^2 / (2 l^2))`` (``l``, ``w``
            learned): near an observation with a large ``w`` the prediction is the observation, far from all of
            them the interpolation. This is GP conditioning (``gridtnp.nn.conditioning.rank_one_posterior``) with
            each target's neighbours fully correlated with it and seeing it with noise ``1 / a_j``.
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
        departures: Departures | Mapping[str, Any] | None = None,
        adaptive: bool = False,
        dim_x: int = 2,
        spread: str | None = None,
        spread_power: float = 0.0,
        regression: Regression | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        sources = [sources] if isinstance(sources, str) else list(sources)
        unknown = [s for s in sources if s not in source_dims]
        if not sources or unknown:
            raise ValueError(
                f"{WHERE}: sources must be a non-empty list of the model's context sources {sorted(source_dims)}; "
                f"got {sources!r}."
            )
        narrow = {s: source_dims[s] for s in sources if source_dims[s] < dim_y}
        if narrow:
            raise ValueError(f"{WHERE}: sources {narrow} have fewer value columns than the targets' Dy = {dim_y}.")
        if k < 1:
            raise ValueError(f"{WHERE} needs k >= 1; got k = {k}.")
        self.sources, self.dim_y, self.k = sources, dim_y, k
        self.lengthscale = self._per_source(lengthscale, "lengthscale")
        self.weight = self._per_source(weight, "weight")
        self.log_lengthscale = nn.Parameter(torch.tensor([math.log(self.lengthscale[s]) for s in sources]))
        self.log_weight = nn.Parameter(torch.tensor([math.log(self.weight[s]) for s in sources]))
        self.departures = Departures.parse(departures)  # a recipe's mapping becomes typed options here
        if self.departures is not None:
            self.departures.check_source(sources, source_dims, dim_y)
            d = self.departures
            self.log_departure_scale = nn.Parameter(torch.tensor([math.log(d.lengthscale), math.log(d.weight)]))
        self.num_features = len(sources) + (0 if departures is None else 1 + 2 * dim_y)
        self.features = nn.Linear(self.num_features, dim)
        nn.init.zeros_(self.features.weight)
        nn.init.zeros_(self.features.bias)
        if not isinstance(adaptive, bool):
            raise ValueError(f"{WHERE}: adaptive must be true or false; got {adaptive!r}.")
        self.adaptive = adaptive
        if spread is not None and (
            spread not in source_dims or source_dims[spread] < dim_y or not [s for s in sources if s != spread]
        ):
            raise ValueError(
                f"{WHERE}: spread must name a context source {sorted(source_dims)} with the targets' variables, and "
                f"another source must be listed in sources ({sources}) to measure its departures against; got "
                f"{spread!r}."
            )
        self.spread = spread
        self.spread_power = number(spread_power, "spread_power", positive=False)
        if spread is None and self.spread_power != 0.0:
            raise ValueError(f"{WHERE}: spread_power ({spread_power!r}) needs spread (e.g. spread: stations).")
        # log nu_0 and alpha of the std factor (nu / nu_0)^alpha.
        self.spread_scale = (
            nn.Parameter(torch.tensor([math.log(0.2), self.spread_power])) if spread is not None else None
        )
        self.direction = nn.Linear(dim, 2 * dim_x) if adaptive else None
        if self.direction is not None:
            nn.init.zeros_(self.direction.weight)
            nn.init.zeros_(self.direction.bias)
        regression = Regression.parse(regression)
        self.regression = None if regression is None else regression.for_sources(sources)
        if self.regression is not None:
            spec = self.regression
            per_source = (1 + spec.gain + basis_size(dim_x, spec.degree)) * (1 + basis_size(dim_x, spec.position))
            terms = len(spec.sources) * per_source * dim_y
            self.coefficients = LearnedGridEmbedding(dim_x, spec.grid, terms, init_std=0.0, lr_scale=spec.lr_scale)
            own = spec.lengthscale  # else the interpolation's lengthscales, shared
            self.log_regression_lengthscale = (
                None if own is None else nn.Parameter(torch.tensor([own[s] for s in spec.sources]).log())
            )

    def _per_source(self, value: float | dict[str, float], what: str) -> dict[str, float]:
        """``{source: value}`` from one value or a mapping, each finite and > 0."""
        values = dict(value) if isinstance(value, dict) else dict.fromkeys(self.sources, value)
        if set(values) != set(self.sources):
            raise ValueError(f"{WHERE}: {what} must be one number or one per source {self.sources}; got {value!r}.")
        return {s: number(v, f"{what} of {s!r}") for s, v in values.items()}

    def forward(
        self, context: dict[str, tuple[Tensor, Tensor, Tensor]], xt: Tensor
    ) -> tuple[Tensor, Tensor, Neighbours]:
        """The interpolation ``[B, Nt, Dy]``, its features ``[B, Nt, num_features]`` (see ``dim``) and the
        neighbours it used (for ``adapt``).

        ``context``: ``{source: (x [B, N, Dx], y [B, N, Dy'], valid [B, N])}`` with invalid rows zeroed.
        """
        near = self._neighbours(context, xt)
        mean, share = self._weighted(near)
        near = near._replace(base=mean)  # adapt reweights the neighbours of this, without the regression
        if self.regression is not None:
            mean = mean + self._regress(near, share, xt)
        if self.spread is not None:
            near = near._replace(spread=self._spread_factor(context))
        if self.departures is None:
            return mean, share, near
        xs, ys, valid = context[self.departures.source]
        k = min(self.departures.k, xs.shape[1])
        if k == 0:  # a batch without any point of the source: nothing to add
            zeros = mean.new_zeros(*mean.shape[:-1], 1 + 2 * self.dim_y)
            return mean, torch.cat([share, zeros], -1), near
        at_points, _ = self._weighted(self._neighbours(context, xs))  # [B, Ns, Dy]
        departure = (ys[..., : self.dim_y] - at_points) * valid.unsqueeze(-1).to(ys.dtype)
        index, ok = knn_points(xs, valid, xt, k)  # [B, Nt, k]
        b, nt, _ = index.shape
        flat = index.reshape(b, nt * k, 1)
        xn = xs.gather(1, flat.expand(-1, -1, xs.shape[-1])).view(b, nt, k, -1)
        dn = departure.gather(1, flat.expand(-1, -1, self.dim_y)).view(b, nt, k, -1)
        log_l, log_w = self.log_departure_scale.unbind()
        d2 = (xt.unsqueeze(-2) - xn).square().sum(-1)
        a = torch.where(ok, exp_floored(log_w - 0.5 * d2 * torch.exp(-2 * log_l)), 0.0)  # [B, Nt, k]
        spread, lam = rank_one_posterior(a, dn)  # [B, Nt, Dy], [B, Nt, k]
        spread_sq = (lam.unsqueeze(-1) * dn.square()).sum(-2)
        return mean + spread, torch.cat([share, lam.sum(-1, keepdim=True), spread, spread_sq], -1), near

    def _regress(self, near: Neighbours, share: Tensor, xt: Tensor) -> Tensor:
        """The per-place regression's correction ``[B, Nt, Dy]`` (see ``regression``)."""
        b, nt, dy = *xt.shape[:2], self.dim_y
        terms = []
        parts = zip(
            near.logits.split(near.sizes, -1),
            near.values.split(near.sizes, -2),
            near.offsets.split(near.sizes, -2),
            share.unbind(-1),
            self.sources,
            strict=True,
        )
        for i, (logits, values, offsets, a, source) in enumerate(parts):
            if source not in self.regression.sources:
                continue
            if self.log_regression_lengthscale is not None:  # offsets and Gaussian weights under its own lengthscale
                j = self.regression.sources.index(source)
                offsets = offsets * torch.exp(self.log_lengthscale[i] - self.log_regression_lengthscale[j])
                logits = torch.where(torch.isfinite(logits), -0.5 * offsets.square().sum(-1), float("-inf"))
            w = torch.softmax(floor_logits(logits), -1).nan_to_num(0.0).unsqueeze(-1)  # [B, Nt, k, 1], per source
            level = (w * values).sum(-2, keepdim=True)  # [B, Nt, 1, Dy]
            phi = shape_basis(offsets.to(values.dtype), self.regression.degree)  # [B, Nt, k, P]
            g = torch.einsum("btkp,btky->btpy", w * phi, values - level)  # [B, Nt, P, Dy]
            first = [torch.ones_like(level), level] if self.regression.gain else [torch.ones_like(level)]
            g = a[..., None, None] * torch.cat([*first, g], -2)  # [B, Nt, 1 (+ 1) + P, Dy]
            if self.regression.position > 0:
                psi = self._position_basis(logits, offsets).to(g.dtype)  # [B, Nt, Q]
                g = (g.unsqueeze(-2) * psi[..., None, :, None]).flatten(-3, -2)  # [B, Nt, (1 + P) Q, Dy]
            terms.append(g)
        features = torch.cat(terms, -2)  # [B, Nt, S' (1 + P) Q, Dy]
        coefficients = self.coefficients(xt).view(b, nt, -1, dy).to(features.dtype)
        return (coefficients * features).sum(-2)

    def _position_basis(self, logits: Tensor, offsets: Tensor) -> Tensor:
        """``[1, phi(u)]`` ``[B, Nt, Q]`` of each target's offset ``u`` from its nearest valid neighbour (for a block
        average: where the target sits in its block), ``phi`` the monomials up to ``regression.position``."""
        distance = offsets.square().sum(-1).masked_fill(~torch.isfinite(logits), float("inf"))  # [B, Nt, k]
        nearest = distance.argmin(-1, keepdim=True)  # [B, Nt, 1]
        u = -offsets.gather(-2, nearest.unsqueeze(-1).expand(*nearest.shape, offsets.shape[-1])).squeeze(-2)
        phi = shape_basis(u, self.regression.position)  # [B, Nt, Q - 1]
        return torch.cat([torch.ones_like(phi[..., :1]), phi], -1)

    def _spread_factor(self, context: dict[str, tuple[Tensor, Tensor, Tensor]]) -> Tensor:
        """The std factor ``(nu / nu_0)^alpha`` ``[B, 1, 1]`` of each task (see ``spread``)."""
        if self.spread not in context or context[self.spread][0].shape[1] == 0:  # no point of it here: nu = nu_0
            _, y, _ = next(iter(context.values()))
            return torch.ones(y.shape[0], 1, 1, dtype=y.dtype, device=y.device)
        xs, ys, valid = context[self.spread]
        log_nu0, alpha = self.spread_scale.unbind()
        others = [s for s in self.sources if s != self.spread]
        at_points, _ = self._weighted(self._neighbours(context, xs, others))  # [B, Ns, Dy]
        d2 = (ys[..., : self.dim_y] - at_points).square().mean(-1) * valid.to(ys.dtype)  # [B, Ns]
        prior = SPREAD_PRIOR_POINTS
        nu2 = (d2.sum(-1) + prior * torch.exp(2 * log_nu0)) / (valid.sum(-1).to(ys.dtype) + prior)
        return torch.exp(alpha * (0.5 * torch.log(nu2) - log_nu0)).view(-1, 1, 1)

    def _neighbours(
        self, context: dict[str, tuple[Tensor, Tensor, Tensor]], xt: Tensor, sources: Sequence[str] | None = None
    ) -> Neighbours:
        """Each target's ``k`` nearest valid points of each listed source (or of ``sources``, a subset): their
        kernel logits, values and offsets."""
        # The k nearest of each source apart: over all sources together, near points of a dense source (stations)
        # would crowd the coarse field's points out of a target's neighbourhood and leave a worse interpolation.
        logits, values, offsets = [], [], []
        for i, s in enumerate(self.sources):
            if sources is not None and s not in sources:
                continue
            xc, yc, valid = context[s][0], context[s][1][..., : self.dim_y], context[s][2]
            index, ok = knn_points(xc, valid, xt, min(self.k, xc.shape[1]))  # [B, Nt, k]
            b, nt, k = index.shape
            flat = index.reshape(b, nt * k, 1)
            xn = xc.gather(1, flat.expand(-1, -1, xc.shape[-1])).view(b, nt, k, -1)
            values.append(yc.gather(1, flat.expand(-1, -1, yc.shape[-1])).view(b, nt, k, -1))
            offset = (xn - xt.unsqueeze(-2)) * torch.exp(-self.log_lengthscale[i])  # in lengthscales
            logit = self.log_weight[i] - 0.5 * offset.square().sum(-1)  # [B, Nt, k]
            logits.append(logit.masked_fill(~ok, float("-inf")))
            offsets.append(offset)
        sizes = tuple(logit.shape[-1] for logit in logits)  # k, or fewer for a source with fewer points
        return Neighbours(torch.cat(logits, -1), torch.cat(values, -2), torch.cat(offsets, -2), sizes)

    @staticmethod
    def _weighted(near: Neighbours, extra: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The softmax-weighted mean ``[B, Nt, Dy]`` of the neighbours' values (``extra`` added to the logits) and
        each source's weight share ``[B, Nt, S]``."""
        logits = near.logits
        if extra is not None:  # invalid neighbours stay at -inf, and no gradient reaches `extra` through them
            logits = torch.where(torch.isfinite(logits), logits + extra, float("-inf"))
        weights = torch.softmax(floor_logits(logits), -1).nan_to_num(0.0)  # no valid neighbour at all: zeros
        mean = (weights.unsqueeze(-1) * near.values).sum(-2)
        return mean, torch.stack([w.sum(-1) for w in weights.split(near.sizes, -1)], -1)

    def adapt(self, near: Neighbours, zt: Tensor) -> Tensor:
        """With ``adaptive``: the change ``[B, Nt, Dy]`` of the interpolation when the decoded target tokens
        ``zt [B, Nt, D]`` reweight the neighbours by direction (zero at initialisation)."""
        if self.direction is None:
            raise RuntimeError("InterpolationResidual.adapt needs adaptive=True.")
        coeff = self.direction(zt.to(self.direction.weight.dtype)).unsqueeze(-2)  # [B, Nt, 1, 2 Dx]
        phi = torch.cat([near.offsets, near.offsets.square()], -1).to(coeff.dtype)  # [B, Nt, K, 2 Dx]
        adapted, _ = self._weighted(near, (coeff * phi).sum(-1))
        return adapted - (self._weighted(near)[0] if near.base is None else near.base)

    def target_features(self, features: Tensor) -> Tensor:
        """The learned embedding ``[B, Nt, D]`` of the features ``[B, Nt, num_features]`` (added to the target
        tokens by the model)."""
        return self.features(features.to(self.features.weight.dtype))


def shift_mean(dist: Distribution, offset: Tensor, scale: Tensor | None = None) -> Normal:
    """``dist`` (a Normal) with ``offset [B, Nt, Dy]`` added to its mean and, if given, its std multiplied by
    ``scale`` (broadcastable; it does not reweight the mean's gradient)."""
    if not isinstance(dist, Normal):
        raise TypeError(f"residual needs a Gaussian likelihood (a Normal predictive); got {type(dist).__name__}.")
    loc = dist.loc + offset.to(dist.loc.dtype)
    if scale is None:
        return rescaled(dist, loc)
    scale = scale.to(dist.scale.dtype)
    if loc.requires_grad:
        # Same value; the mean's gradient times scale^2, so that d(-log p)/d(mean) = (mean - y) / std_net^2 as
        # without the factor: a wide day widens the std without weighing less in the fit of the mean.
        fixed = loc.detach()
        loc = fixed + (loc - fixed) * scale.detach().square()
    return rescaled(dist, loc, scale)  # a joint predictive keeps its correlations
