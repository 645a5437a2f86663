"""The {On, Off}-the-grid thesis's 1-D two-modality task (Langezaal 2024, Section 4.1): a Hadamard-style two-task
GP, one task observed on a regular grid, the other at scattered points and at the targets.

Tasks ``t in {0, 1}`` (0: off the grid, 1: on the grid) share an SE kernel ``k`` with the task covariance
``C = [[1, c], [c, 1]]``: ``cov(f_s(x), f_t(x')) = C[s, t] k(x, x')`` (Bonilla et al. 2007; the Hadamard form
of Remes et al. 2017). Sampled exactly (Cholesky of the joint covariance) in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gridtnp.batch import Batch, Observations
from gridtnp.data.synthetic.gp_kernels import jittered_cholesky, joint_predictive_loglik
from gridtnp.data.tasks import check_positive, check_range, check_sizes, random_sizes, uniform, zero_padding
from gridtnp.registry import ConfigError, register

MODALITIES = ("both", "off_grid", "on_grid")
GRID_LAYOUTS = ("centres", "ends")


def hadamard_covariance(x: Tensor, task: Tensor, lengthscale: Tensor, correlation: float) -> Tensor:
    """``C[t_i, t_j] exp(-(x_i - x_j)^2 / (2 l^2))``: ``x [B, N]``, ``task [N]`` (0 / 1), ``l [B]`` -> ``[B, N, N]``."""
    x = x.to(torch.float64)
    k = torch.exp(-0.5 * (x[:, :, None] - x[:, None, :]).square() / lengthscale.to(torch.float64)[:, None, None] ** 2)
    same = task[:, None] == task[None, :]
    return k * torch.where(same, 1.0, float(correlation)).to(torch.float64)


@register("task", "gp1d_multimodal")
class GP1DMultimodal:
    """Thesis 1-D two-modality GP: SE Hadamard two-task GP, on-grid context ``"grid"``, off-grid ``"points"``.

    Context ``"points"``: ``N_c ~ U{min_context..max_context}`` points ``x ~ U[context_range]`` of the off-grid task;
    context ``"grid"``: the on-grid task at the cell centres of ``points_per_unit`` points per unit over
    ``grid_range`` (thesis: 8 per unit over [-4, 4], 64 points); targets: ``num_targets`` points
    ``x ~ U[target_range]`` of the off-grid task. Length-scale ``l = exp(u)``, ``u ~ U[log_lengthscale_range]`` per
    task (the thesis draws it per batch from a range it does not state; [log 0.25, log 4] as the TE-TNP task).
    ``modalities``: ``both``, ``off_grid`` (no grid source) or ``on_grid`` (no points source): Table 4.1's columns
    and Figure 4.3's ablations. ``extras["oracle_loglik"] [B]``: the exact posterior predictive log-density of the
    targets given both context sets (those the model sees).

    Args:
        correlation: c in [-1, 1], the task correlation (the thesis uses 0, 0.5, 0.8 and 1).
        log_lengthscale_range: ``(a, b)``: ``log l ~ U[a, b]`` per task.
        noise: standard deviation of the observation noise of both modalities and the targets.
        min_context: fewest off-grid context points of a task.
        max_context: most off-grid context points of a task.
        num_targets: target points per task.
        context_range: interval of the off-grid context x.
        target_range: interval of the target x.
        grid_range: interval of the on-grid x.
        points_per_unit: on-grid points per unit length.
        grid_layout: ``centres`` (the centres of equal cells of ``grid_range``) or ``ends`` (from its lower to its
            upper end, both included).
        draw_per_batch: one length-scale and one off-grid context size for all tasks of a batch.
        modalities: ``both``, ``off_grid`` or ``on_grid``: which context sources the tasks have.
        oracle: add the exact posterior predictive log-density (``extras["oracle_loglik"]``).
        jitter: added to the covariance's diagonal for the Cholesky factor.
    """

    def __init__(
        self,
        correlation: float = 0.8,
        log_lengthscale_range: Sequence[float] = (math.log(0.25), math.log(4.0)),
        noise: float = 0.1,
        min_context: int = 1,
        max_context: int = 64,
        num_targets: int = 128,
        context_range: Sequence[float] = (-2.0, 2.0),
        target_range: Sequence[float] = (-4.0, 4.0),
        grid_range: Sequence[float] = (-4.0, 4.0),
        points_per_unit: float = 8.0,
        grid_layout: str = "centres",
        draw_per_batch: bool = False,
        modalities: str = "both",
        oracle: bool = True,
        jitter: float = 1e-6,
    ) -> None:
        name = "gp1d_multimodal"
        if not -1.0 <= correlation <= 1.0:
            raise ConfigError(f"{name}: correlation must be in [-1, 1]; got {correlation}.")
        if modalities not in MODALITIES:
            raise ConfigError(f"{name}: modalities must be one of {MODALITIES}; got {modalities!r}.")
        if grid_layout not in GRID_LAYOUTS:
            raise ConfigError(f"{name}: grid_layout must be one of {GRID_LAYOUTS}; got {grid_layout!r}.")
        check_sizes(name, "min_context", min_context, "max_context", max_context)
        check_sizes(name, "num_targets", num_targets, "num_targets", num_targets, smallest=1)
        self.log_lengthscale_range = check_range(name, "log_lengthscale_range", log_lengthscale_range, True)
        self.context_range = check_range(name, "context_range", context_range)
        self.target_range = check_range(name, "target_range", target_range)
        low, high = check_range(name, "grid_range", grid_range)
        n_grid = round((high - low) * check_positive(name, "points_per_unit", points_per_unit))
        if n_grid < (1 if grid_layout == "centres" else 2):
            raise ConfigError(
                f"{name}: grid_range x points_per_unit gives {n_grid} grid point(s); {grid_layout} needs more."
            )
        if grid_layout == "centres":
            self.grid_x = low + (torch.arange(n_grid, dtype=torch.float64) + 0.5) * (high - low) / n_grid  # [G]
        else:
            self.grid_x = torch.linspace(low, high, n_grid, dtype=torch.float64)  # [G]
        self.correlation, self.noise = float(correlation), check_positive(name, "noise", noise, allow_zero=True)
        self.min_context, self.max_context, self.num_targets = min_context, max_context, num_targets
        self.modalities, self.oracle, self.jitter = modalities, oracle, jitter
        self.draw_per_batch = bool(draw_per_batch)
        self.dim_x = 1
        self.dim_y = {s: 1 for s in self.sources}
        self.target_dim_y = 1

    @property
    def sources(self) -> list[str]:
        """The context sources of the tasks, in order."""
        return {"both": ["grid", "points"], "off_grid": ["points"], "on_grid": ["grid"]}[self.modalities]

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """Context ``grid`` ``x [B, G, 1]`` and ``points`` ``x [B, N_c, 1]`` (padded), targets ``x [B, N_t, 1]``."""
        g, b = generator, batch_size
        draws = 1 if self.draw_per_batch else b  # tasks with their own length-scale and context size
        _, mask_c = random_sizes(draws, self.min_context, self.max_context, g)
        mask_c = mask_c.expand(b, -1).contiguous()
        nc, nt, ng = mask_c.shape[1], self.num_targets, len(self.grid_x)
        x_c = uniform((b, nc), *self.context_range, g).to(torch.float64)
        x_t = uniform((b, nt), *self.target_range, g).to(torch.float64)
        x = torch.cat([self.grid_x.expand(b, ng), x_c, x_t], 1)  # [B, G + N_c + N_t]: grid, points, targets
        task = torch.cat([torch.ones(ng, dtype=torch.long), torch.zeros(nc + nt, dtype=torch.long)])
        low, high = self.log_lengthscale_range
        lengthscale = torch.exp(low + (high - low) * torch.rand(draws, generator=g, dtype=torch.float64)).expand(b)
        cov = hadamard_covariance(x, task, lengthscale, self.correlation)
        chol, _ = jittered_cholesky(cov, self.jitter)
        f = (chol @ torch.randn(b, x.shape[1], 1, generator=g, dtype=torch.float64))[..., 0]
        y = f + self.noise * torch.randn(f.shape, generator=g, dtype=torch.float64)

        context = {}
        if "grid" in self.sources:
            context["grid"] = Observations(
                x[:, :ng, None].float(), y[:, :ng, None].float(), torch.ones(b, ng, dtype=torch.bool), "context"
            )
        if "points" in self.sources:
            xc, yc = x[:, ng : ng + nc, None].float(), y[:, ng : ng + nc, None].float()
            context["points"] = Observations(zero_padding(xc, mask_c), zero_padding(yc, mask_c), mask_c, "context")
        mask_t = torch.ones(b, nt, dtype=torch.bool)
        target = Observations(x[:, ng + nc :, None].float(), y[:, ng + nc :, None].float(), mask_t, "target")
        extras = {"lengthscale": lengthscale.float()}
        if self.oracle and self.noise > 0:
            seen = torch.cat(
                [
                    torch.full((b, ng), "grid" in self.sources, dtype=torch.bool),
                    mask_c & ("points" in self.sources),
                ],
                1,
            )
            extras["oracle_loglik"] = joint_predictive_loglik(cov, y, seen, self.noise**2)
        return Batch(context, target, extras)
