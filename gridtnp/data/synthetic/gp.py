"""Gaussian-process tasks: 1-D meta-regression, large 2-D tasks and a two-modality 2-D task.

* ``gp1d``: the 1-D regression benchmark of the TE-TNP paper (Ashman et al., 2024): a kernel family per task
  (SE, Matern-5/2, periodic), random length-scale, noisy observations, exact oracle log-likelihood.
* ``gp2d``: the large 2-D tasks of the gridded TNP paper: SE kernel on [-6, 6]^2, 10,000 context and 1,000
  target points, drawn by structured kernel interpolation (SKI) from a Kronecker grid.
* ``gp2d_multimodal``: two correlated SKI fields; one observed on a regular grid, the other at scattered points.

Kernels are gpytorch kernels with hyperparameters set directly; sampling and oracles run in float64 and
every returned tensor is float32 on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gridtnp.batch import DEFAULT_SOURCE, Batch, Observations, declare_extras
from gridtnp.data.synthetic.gp_kernels import (
    KERNELS,
    SKI_MARGIN,
    SKIGrid,
    jittered_cholesky,
    joint_predictive_loglik,
    mixed_kernel_matrix,
    posterior_predictive,
    ski_grid_size,
)
from gridtnp.data.tasks import (
    check_positive,
    check_range,
    check_ranges,
    check_sizes,
    random_sizes,
    uniform,
    uniform_union,
    zero_padding,
)
from gridtnp.registry import ConfigError, register

#: Forms of GP1D's periodic kernel: the TE-TNP paper's k_pe (period = length-scale) or the standard one.
PERIODIC_FORMS = ("paper", "standard")
#: The largest context + target count for which the 2-D tasks compute an exact oracle log-likelihood.
MAX_ORACLE_POINTS = 2000


declare_extras(
    "gp1d",
    {
        "kernel": ("[B]", "GP kernel family, an index into the task's kernels as a float: the true posterior in plots"),
        "lengthscale": ("[B]", "GP lengthscale: the true posterior in plots"),
        "period": ("[B]", "GP period: the true posterior in plots"),
    },
)


@register("task", "gp1d")
class GP1D:
    """1-D GP regression (TE-TNP): per task an SE / Matern-5/2 / periodic kernel, log-uniform length-scale, noise.

    Length-scale ``l = exp(u)``, ``u ~ U[min_log_lengthscale, max_log_lengthscale]`` (default [log 0.25, log 4]).
    The periodic kernel is, by default (``periodic="paper"``), the TE-TNP paper's
    ``k_pe(x, x') = exp(-2 sin^2(pi |x - x'| / l))``: the length-scale is the period; ``periodic="standard"``
    uses ``exp(-2 sin^2(pi |x - x'| / p) / l^2)`` with the same ``l`` and a period ``p ~ U[period_range]``.
    Output scale 1. ``N_c ~ U{min_context..max_context}`` per task
    (padded to the batch maximum), ``N_t = num_targets``; ``x_c ~ U[context_range]``, ``x_t ~ U[target_range]``.
    A range may be a union of intervals (the bimodal test: ``[[-4, -1], [1, 4]]``); ``shift`` (Delta) moves both
    ranges, the TE-TNP paper's shifted test sets (train with ``shift: 0``, test with ``shift: 1``).
    ``extras["oracle_loglik"] [B]``: mean per-target log-density under the true GP posterior predictive; with it,
    ``extras["kernel"]`` (index into ``kernels``, as a float), ``extras["lengthscale"]`` and ``extras["period"]``
    ``[B]``, from which :meth:`posterior` gives the true posterior anywhere (for plots).

    Args:
        kernels: kernel families drawn uniformly per task, a subset of ``se``, ``matern52``, ``periodic``.
        min_log_lengthscale: lower end of the log length-scale's uniform range.
        max_log_lengthscale: upper end of the log length-scale's uniform range.
        period_range: range of the periodic kernel's period, drawn uniformly per task (``periodic="standard"``).
        min_context: fewest context points of a task.
        max_context: most context points of a task (the batch is padded to its largest).
        num_targets: target points per task.
        context_range: interval (or list of intervals) the context x are drawn from, uniformly.
        target_range: interval (or list of intervals) the target x are drawn from, uniformly.
        shift: added to both ranges (Delta of the TE-TNP paper's shifted test sets).
        noise: standard deviation of the Gaussian observation noise.
        oracle: add the exact GP posterior predictive log-density per task (``extras["oracle_loglik"]``).
        jitter: added to the kernel matrix's diagonal for the Cholesky factorisation.
        periodic: ``paper`` (k_pe, period = the length-scale) or ``standard`` (length-scale and a drawn period).
    """

    def __init__(
        self,
        kernels: Sequence[str] = KERNELS,
        min_log_lengthscale: float = math.log(0.25),
        max_log_lengthscale: float = math.log(4.0),
        period_range: tuple[float, float] = (0.5, 2.0),
        min_context: int = 1,
        max_context: int = 64,
        num_targets: int = 128,
        context_range: Sequence[float] | Sequence[Sequence[float]] = (-2.0, 2.0),
        target_range: Sequence[float] | Sequence[Sequence[float]] = (-3.0, 3.0),
        shift: float = 0.0,
        noise: float = 0.2,
        oracle: bool = True,
        jitter: float = 1e-6,
        periodic: str = "paper",
    ) -> None:
        name = "gp1d"
        if periodic not in PERIODIC_FORMS:
            raise ConfigError(f"{name}: periodic must be one of {PERIODIC_FORMS}; got {periodic!r}.")
        self.periodic = periodic
        self.kernels = tuple(kernels)
        unknown = [k for k in self.kernels if k not in KERNELS]
        if not self.kernels or unknown:
            raise ConfigError(f"{name}: kernels must be a non-empty subset of {KERNELS}; got {tuple(kernels)}.")
        if not min_log_lengthscale <= max_log_lengthscale:
            raise ConfigError(
                f"{name}: need min_log_lengthscale <= max_log_lengthscale; "
                f"got {min_log_lengthscale} > {max_log_lengthscale}."
            )
        check_sizes(name, "min_context", min_context, "max_context", max_context)
        check_sizes(name, "num_targets", num_targets, "num_targets", num_targets, smallest=1)
        self.log_lengthscale_range = (float(min_log_lengthscale), float(max_log_lengthscale))
        self.period_range = check_range(name, "period_range", period_range, allow_equal=True)
        check_positive(name, "period_range[0]", self.period_range[0])
        self.context_range = check_ranges(name, "context_range", context_range, float(shift))
        self.target_range = check_ranges(name, "target_range", target_range, float(shift))
        self.noise = check_positive(name, "noise", noise, allow_zero=True)
        self.jitter = check_positive(name, "jitter", jitter)
        self.min_context, self.max_context, self.num_targets = min_context, max_context, num_targets
        self.oracle = oracle
        self.dim_x = 1
        self.dim_y = {DEFAULT_SOURCE: 1}
        self.target_dim_y = 1

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` tasks: context ``x [B, N_c, 1]`` (padded, masked), targets ``x [B, N_t, 1]``."""
        g, b = generator, batch_size
        family = torch.randint(len(self.kernels), (b,), generator=g)
        lengthscale = uniform((b,), *self.log_lengthscale_range, g).exp()
        period = uniform((b,), *self.period_range, g)
        if self.periodic == "paper":
            period = lengthscale.clone()
        _, mask_c = random_sizes(b, self.min_context, self.max_context, g)
        nc, nt = mask_c.shape[1], self.num_targets
        x_c = uniform_union((b, nc, 1), self.context_range, g)
        x = torch.cat([x_c, uniform_union((b, nt, 1), self.target_range, g)], 1)

        cov = mixed_kernel_matrix(x, family, lengthscale, period, self.kernels, self.periodic_lengthscale)
        chol, cov = jittered_cholesky(cov, self.jitter)
        f = chol @ torch.randn(b, nc + nt, 1, generator=g, dtype=torch.float64)
        y = f + self.noise * torch.randn(b, nc + nt, 1, generator=g, dtype=torch.float64)

        mask_t = torch.ones(b, nt, dtype=torch.bool)
        extras = {}
        if self.oracle:
            extras["oracle_loglik"] = joint_predictive_loglik(cov, y[..., 0], mask_c, self.noise**2)
            extras.update(kernel=family.float(), lengthscale=lengthscale.float(), period=period.float())
        y = y.float()
        context = Observations(zero_padding(x[:, :nc], mask_c), zero_padding(y[:, :nc], mask_c), mask_c, "context")
        target = Observations(x[:, nc:], y[:, nc:], mask_t, "target")
        return Batch({DEFAULT_SOURCE: context}, target, extras)

    @property
    def periodic_lengthscale(self) -> float | None:
        """The periodic kernel's fixed length-scale: 1 for the paper's ``k_pe``, None (the task's ``l``) else."""
        return 1.0 if self.periodic == "paper" else None

    def posterior(self, batch: Batch, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """True GP posterior predictive mean and std of noisy observations at ``x [B, Q, 1]`` given the batch's
        context, ``[B, Q]`` each (float32); None when the batch does not carry its kernels (``oracle=False``)."""
        if not {"kernel", "lengthscale", "period"} <= set(batch.extras):
            return None
        ctx = batch.context[DEFAULT_SOURCE]
        family, lengthscale, period = (batch.extras[k].cpu() for k in ("kernel", "lengthscale", "period"))
        family = family.round().long()  # extras are float32 by convention
        xc, yc, mask = ctx.x.cpu().double(), ctx.y.cpu()[..., 0].double(), ctx.mask.cpu()
        x = x.cpu().double()
        joint = torch.cat([xc, x], 1)
        cov = mixed_kernel_matrix(joint, family, lengthscale, period, self.kernels, self.periodic_lengthscale)
        nc = xc.shape[1]
        k_tt = cov[:, nc:, nc:].diagonal(dim1=-2, dim2=-1)
        mean, var = posterior_predictive(
            cov[:, :nc, :nc] + self.jitter * torch.eye(nc, dtype=cov.dtype),
            cov[:, nc:, :nc],
            k_tt,
            yc,
            mask,
            self.noise**2,
        )
        return mean.float(), var.sqrt().float()


def _check_ski(name: str, lengthscale: float, noise: float, grid_size: int | None, domain: tuple[float, float]) -> int:
    """Check the SKI arguments; return the grid size (the default: 4 nodes per length-scale)."""
    check_positive(name, "lengthscale", lengthscale)
    check_positive(name, "noise", noise, allow_zero=True)
    if grid_size is not None and grid_size < 4 + 2 * SKI_MARGIN:
        raise ConfigError(f"{name}: grid_size must be >= {4 + 2 * SKI_MARGIN}; got {grid_size}.")
    return ski_grid_size(check_range(name, "domain", domain), lengthscale, grid_size)


def _check_oracle(name: str, oracle: bool, noise: float, points: int) -> None:
    if oracle and points > MAX_ORACLE_POINTS:
        raise ConfigError(
            f"{name}: oracle=True needs at most {MAX_ORACLE_POINTS} context + target points (an exact GP "
            f"posterior); this task has up to {points}. Set oracle=False or use fewer points."
        )
    if oracle and noise <= 0:
        raise ConfigError(f"{name}: oracle=True needs noise > 0; got noise={noise}.")


@register("task", "gp2d")
class GP2D:
    """Large 2-D GP tasks (gridded TNP): SE kernel, ``x ~ U[domain]^2``, drawn by SKI from a Kronecker grid.

    ``N_c = num_context`` (or ``~ U{min_context..num_context}`` per task, padded and masked, when
    ``min_context`` is set), ``N_t = num_targets``. ``oracle=True`` adds ``extras["oracle_loglik"] [B]``, exact
    under the SKI covariance that generated the data; only for at most 2,000 points in all.

    Args:
        lengthscale: SE kernel length-scale.
        noise: standard deviation of the Gaussian observation noise.
        num_context: context points per task (the most, when ``min_context`` is set).
        num_targets: target points per task.
        min_context: null for exactly ``num_context`` context points; else the fewest, drawn uniformly per task.
        domain: ``(low, high)``: x is drawn uniformly from ``[low, high]^2``.
        grid_size: points per dimension of the SKI interpolation grid the field is drawn on; null: 4 per length-scale
            (an SE field to 0.002 in covariance); 100 is the paper's, too coarse for l = 0.1 over [-6, 6].
        oracle: add the exact posterior predictive log-density under the SKI covariance (at most 2,000 points).
        jitter: added to the per-dimension kernel matrices' diagonals for their Cholesky factors.
    """

    def __init__(
        self,
        lengthscale: float = 0.5,
        noise: float = 0.1,
        num_context: int = 10_000,
        num_targets: int = 1_000,
        min_context: int | None = None,
        domain: tuple[float, float] = (-6.0, 6.0),
        grid_size: int | None = None,
        oracle: bool = False,
        jitter: float = 1e-6,
    ) -> None:
        name = "gp2d"
        grid_size = _check_ski(name, lengthscale, noise, grid_size, domain)
        check_sizes(
            name, "min_context", num_context if min_context is None else min_context, "num_context", num_context
        )
        check_sizes(name, "num_targets", num_targets, "num_targets", num_targets, smallest=1)
        _check_oracle(name, oracle, noise, num_context + num_targets)
        self.domain = check_range(name, "domain", domain)
        self.noise, self.oracle = float(noise), oracle
        self.num_context, self.num_targets, self.min_context = num_context, num_targets, min_context
        self.grid = SKIGrid(self.domain, grid_size, lengthscale, jitter)
        self.dim_x = 2
        self.dim_y = {DEFAULT_SOURCE: 1}
        self.target_dim_y = 1

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` tasks: context ``x [B, N_c, 2]``, targets ``x [B, N_t, 2]``, ``y [B, N, 1]``."""
        g, b = generator, batch_size
        if self.min_context is None:
            mask_c = torch.ones(b, self.num_context, dtype=torch.bool)
        else:
            _, mask_c = random_sizes(b, self.min_context, self.num_context, g)
        nc, nt = mask_c.shape[1], self.num_targets
        x = uniform((b, nc + nt, 2), *self.domain, g)
        f = self.grid.interpolate(self.grid.sample(b, g), x)
        y = (f + self.noise * torch.randn(b, nc + nt, generator=g))[..., None]

        mask_t = torch.ones(b, nt, dtype=torch.bool)
        extras = {}
        if self.oracle:
            cov = self.grid.covariance(x, x)
            extras["oracle_loglik"] = joint_predictive_loglik(cov, y[..., 0], mask_c, self.noise**2)
        context = Observations(zero_padding(x[:, :nc], mask_c), zero_padding(y[:, :nc], mask_c), mask_c, "context")
        target = Observations(x[:, nc:], y[:, nc:], mask_t, "target")
        return Batch({DEFAULT_SOURCE: context}, target, extras)


@register("task", "gp2d_multimodal")
class GP2DMultimodal:
    """Two-modality 2-D GP (Hadamard multitask): ``f1 = g1``, ``f2 = c g1 + sqrt(1 - c^2) g2``, g1, g2 SKI fields.

    Context ``"grid"``: noisy ``f1`` at the cell centres of a regular grid with ``points_per_unit`` points per
    unit length along each axis (``x [B, n*n, 2]``, flattened in 'ij' order so ``x.view(B, n, n, 2)[b, i, j]``
    is ``(c_i, c_j)``). Context ``"points"``: noisy ``f2`` at ``N_c ~ U{min_context..max_context}`` uniform
    points. Targets: noisy ``f2`` at ``num_targets`` uniform points.

    Args:
        correlation: c in [-1, 1], the correlation between the two modalities' fields.
        lengthscale: SE kernel length-scale of both latent fields.
        noise: standard deviation of the Gaussian observation noise of both modalities.
        points_per_unit: gridded-context points per unit length along each axis.
        min_context: fewest scattered context points of a task.
        max_context: most scattered context points of a task.
        num_targets: target points per task.
        domain: ``(low, high)``: the square ``[low, high]^2`` of the grid and the points.
        grid_size: points per dimension of the SKI interpolation grid the fields are drawn on; null: 4 per
            length-scale.
        oracle: add the exact posterior predictive log-density under the SKI covariance.
        jitter: added to the per-dimension kernel matrices' diagonals for their Cholesky factors.
    """

    def __init__(
        self,
        correlation: float = 0.8,
        lengthscale: float = 0.5,
        noise: float = 0.1,
        points_per_unit: float = 4.0,
        min_context: int = 100,
        max_context: int = 500,
        num_targets: int = 250,
        domain: tuple[float, float] = (-3.0, 3.0),
        grid_size: int | None = None,
        oracle: bool = False,
        jitter: float = 1e-6,
    ) -> None:
        name = "gp2d_multimodal"
        grid_size = _check_ski(name, lengthscale, noise, grid_size, domain)
        if not -1.0 <= correlation <= 1.0:
            raise ConfigError(f"{name}: correlation must lie in [-1, 1]; got {correlation}.")
        check_positive(name, "points_per_unit", points_per_unit)
        check_sizes(name, "min_context", min_context, "max_context", max_context)
        check_sizes(name, "num_targets", num_targets, "num_targets", num_targets, smallest=1)
        self.domain = check_range(name, "domain", domain)
        low, high = self.domain
        n = max(1, round(points_per_unit * (high - low)))
        centres = low + (torch.arange(n, dtype=torch.float32) + 0.5) * (high - low) / n
        self.grid_x = torch.stack(torch.meshgrid(centres, centres, indexing="ij"), -1).reshape(n * n, 2)
        _check_oracle(name, oracle, noise, n * n + max_context + num_targets)
        self.correlation, self.noise, self.oracle = float(correlation), float(noise), oracle
        self.min_context, self.max_context, self.num_targets = min_context, max_context, num_targets
        self.grid = SKIGrid(self.domain, grid_size, lengthscale, jitter)
        self.dim_x = 2
        self.dim_y = {"grid": 1, DEFAULT_SOURCE: 1}
        self.target_dim_y = 1

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` tasks: ``context["grid"]`` ``[B, n*n, .]``, ``context["points"]`` ``[B, N_c, .]`` (masked),
        targets ``[B, N_t, .]``."""
        g, b, c = generator, batch_size, self.correlation
        _, mask_c = random_sizes(b, self.min_context, self.max_context, g)
        nc, nt, ng = mask_c.shape[1], self.num_targets, self.grid_x.shape[0]
        x_g = self.grid_x.expand(b, ng, 2)
        x_p = uniform((b, nc + nt, 2), *self.domain, g)
        g1, g2 = self.grid.sample(b, g), self.grid.sample(b, g)
        f1 = self.grid.interpolate(g1, x_g)
        f2 = self.grid.interpolate(c * g1 + math.sqrt(1.0 - c * c) * g2, x_p)
        y_g = (f1 + self.noise * torch.randn(b, ng, generator=g))[..., None]
        y_p = (f2 + self.noise * torch.randn(b, nc + nt, generator=g))[..., None]

        mask_g = torch.ones(b, ng, dtype=torch.bool)
        mask_t = torch.ones(b, nt, dtype=torch.bool)
        extras = {}
        if self.oracle:
            # cov(f1, f1) = k, cov(f1, f2) = c k, cov(f2, f2) = (c^2 + 1 - c^2) k = k.
            x_all = torch.cat([x_g, x_p], 1)
            cov = self.grid.covariance(x_all, x_all)
            cov[:, :ng, ng:] *= c
            cov[:, ng:, :ng] *= c
            y_all = torch.cat([y_g, y_p], 1)[..., 0]
            extras["oracle_loglik"] = joint_predictive_loglik(cov, y_all, torch.cat([mask_g, mask_c], 1), self.noise**2)
        context = {
            "grid": Observations(x_g.clone(), y_g, mask_g, "context[grid]"),
            DEFAULT_SOURCE: Observations(
                zero_padding(x_p[:, :nc], mask_c), zero_padding(y_p[:, :nc], mask_c), mask_c, "context[points]"
            ),
        }
        return Batch(context, Observations(x_p[:, nc:], y_p[:, nc:], mask_t, "target"), extras)
