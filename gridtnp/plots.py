"""Figures of a neural process's predictions: 1-D GP tasks, maps, and standardised errors against N(0, 1).

The ``plot_*`` functions (``plot_gp1d``, ``plot_map``, ``plot_standardised_errors``, ``plot_reliability``: observed
against nominal coverage of central intervals and the PIT histogram) and ``evaluation_figures``
(a task batch -> ``{name: figure}``) return ``matplotlib.figure.Figure`` objects built without ``pyplot`` (no
global state, no GUI backend), ready for ``fig.savefig(path)`` or TensorBoard's ``add_figure``. Maps draw
coastlines with cartopy when it is installed and the coordinates are geographic (``x = (latitude, longitude)`` in
degrees); plain axes otherwise. ``standardised_errors(batch, dist)``: ``(y - mean) / std`` of the valid targets.

``PlotCallback`` logs the figures of the first validation batch to TensorBoard; ``gridtnp plot``
(``gridtnp.cli.main.plot_main``) writes them as PNG files from a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.distributions import Distribution

from gridtnp.batch import Batch, Observations
from gridtnp.data.contract import optional, task_posterior
from gridtnp.metrics import central_interval_halfwidth

Predictor = Callable[[dict[str, Observations], Tensor], Distribution]

#: Sources with more points than this are not marked on every map panel (only drawn in the context panel).
MAX_MARKED_POINTS = 2000


# ----------------------------------------------------------------------------------------------------- shared


def task_batch(batch: Batch, index: int) -> Batch:
    """Task ``index`` of ``batch`` as a batch of one, on the CPU."""
    pick = slice(index, index + 1)

    def one(obs: Observations) -> Observations:
        return Observations(obs.x[pick].cpu(), None if obs.y is None else obs.y[pick].cpu(), obs.mask[pick].cpu())

    b = batch.batch_size
    extras = {k: v[pick].cpu() for k, v in batch.extras.items() if v.dim() and v.shape[0] == b}
    return Batch({k: one(v) for k, v in batch.context.items()}, one(batch.target), extras)


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def regular_grid(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For points ``x [N, 2]`` that fill a regular ``rows x cols`` grid: the two axes and each point's flat cell
    index ``[N]``; None for scattered points."""
    if len(x) < 4:
        return None
    rows, row_index = np.unique(x[:, 0], return_inverse=True)
    cols, col_index = np.unique(x[:, 1], return_inverse=True)
    if len(rows) < 2 or len(cols) < 2 or len(rows) * len(cols) != len(x):
        return None
    flat = row_index * len(cols) + col_index
    if len(np.unique(flat)) != len(x):
        return None
    return rows, cols, flat


def _cartopy() -> Any | None:
    try:
        import cartopy.crs as ccrs
    except ImportError:
        return None
    return ccrs


def _map_axes(fig: Figure, rows: int, cols: int, i: int, geographic: bool) -> tuple[Any, dict[str, Any]]:
    """Subplot ``i`` (1-based) and the keyword arguments that place data on it (cartopy's transform)."""
    ccrs = _cartopy() if geographic else None
    if ccrs is None:
        ax = fig.add_subplot(rows, cols, i)
        if geographic:
            ax.set_xlabel("longitude")
            ax.set_ylabel("latitude")
        return ax, {}
    ax = fig.add_subplot(rows, cols, i, projection=ccrs.PlateCarree())
    ax.coastlines(linewidth=0.6)
    return ax, {"transform": ccrs.PlateCarree()}


def _draw_field(
    ax: Any, x: np.ndarray, values: np.ndarray, geographic: bool, place: dict[str, Any], **style: Any
) -> Any:
    """``values [N]`` at ``x [N, 2]``: an image when the points fill a regular grid, coloured markers otherwise."""
    # Geographic x is (latitude, longitude): longitude goes on the horizontal axis.
    h, v = (x[:, 1], x[:, 0]) if geographic else (x[:, 0], x[:, 1])
    grid = regular_grid(np.stack([v, h], -1))
    if grid is not None:
        rows, cols, flat = grid
        image = np.full(len(rows) * len(cols), np.nan)
        image[flat] = values
        return ax.pcolormesh(cols, rows, image.reshape(len(rows), len(cols)), shading="nearest", **place, **style)
    size = float(np.clip(20_000 / max(len(values), 1), 2, 40))
    return ax.scatter(h, v, c=values, s=size, linewidths=0, **place, **style)


def _mark(ax: Any, x: np.ndarray, geographic: bool, place: dict[str, Any]) -> None:
    h, v = (x[:, 1], x[:, 0]) if geographic else (x[:, 0], x[:, 1])
    ax.scatter(h, v, marker="x", s=12, c="k", linewidths=0.7, label="context", **place)


# ------------------------------------------------------------------------------------------------------ figures


def plot_gp1d(
    predict: Predictor,
    batch: Batch,
    index: int = 0,
    posterior: Callable[[Batch, Tensor], tuple[Tensor, Tensor] | None] | None = None,
    num_points: int = 256,
) -> Figure:
    """Task ``index`` of a 1-D batch: context, targets, predictive mean +- 2 std on a dense grid, and the true
    posterior (mean +- 2 std, dashed) when ``posterior(batch, x [B, Q, 1])`` gives it."""
    one = task_batch(batch, index)
    xs = [o.x[o.mask] for o in (*one.context.values(), one.target)]
    points = torch.cat([x.reshape(-1) for x in xs]) if xs else torch.zeros(1)
    low, high = float(points.min()), float(points.max())
    pad = 0.05 * max(high - low, 1e-3)
    device = next(iter(batch.context.values())).x.device
    xq = torch.linspace(low - pad, high + pad, num_points)[None, :, None]
    with torch.no_grad():
        dist = predict({k: v.to(device) for k, v in one.context.items()}, xq.to(device))
    mean, std = _numpy(dist.mean[0, :, 0]), _numpy(dist.stddev[0, :, 0])
    grid = xq[0, :, 0].numpy()

    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(grid, mean, color="C0", label="model mean")
    ax.fill_between(grid, mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25, label="model +- 2 std")
    truth = posterior(task_batch(batch, index), xq) if posterior is not None else None
    if truth is not None:
        t_mean, t_std = _numpy(truth[0][0]), _numpy(truth[1][0])
        ax.plot(grid, t_mean, "k--", lw=1, label="true GP posterior")
        ax.plot(grid, t_mean - 2 * t_std, "k:", lw=0.8)
        ax.plot(grid, t_mean + 2 * t_std, "k:", lw=0.8)
    for name, obs in one.context.items():
        ax.scatter(
            _numpy(obs.x[obs.mask][:, 0]),
            _numpy(obs.y[obs.mask][:, 0]),
            c="k",
            s=14,
            zorder=3,
            label=f"context ({name})",
        )
    t = one.target
    ax.scatter(_numpy(t.x[t.mask][:, 0]), _numpy(t.y[t.mask][:, 0]), c="C3", s=6, alpha=0.6, label="targets")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(f"task {index}: {int(next(iter(one.context.values())).mask.sum())} context points")
    ax.legend(fontsize=7, loc="best", ncols=2)
    return fig


def plot_map(
    batch: Batch, mean: Tensor, std: Tensor, index: int = 0, geographic: bool = False, title: str = ""
) -> Figure:
    """Task ``index`` of a 2-D batch: targets, predictive mean, std, error and standardised error at the target
    locations (an image for gridded targets, coloured markers for scattered ones), and each context source.

    ``mean, std [B, Nt, Dy]`` (the first output dimension is drawn); off-the-grid context sources with at most
    ``MAX_MARKED_POINTS`` points are marked with crosses on every panel. Values in the batch's (normalised) units.
    """
    one = task_batch(batch, index)
    t = one.target
    keep = _numpy(t.mask[0]).astype(bool)
    x = _numpy(t.x[0])[keep]
    y = _numpy(t.y[0, :, 0])[keep]
    m, s = _numpy(mean[index, :, 0])[keep], _numpy(std[index, :, 0])[keep]
    err, z = m - y, (y - m) / s
    sources = {name: (_numpy(o.x[0])[_numpy(o.mask[0]).astype(bool)], o) for name, o in one.context.items()}
    marked = [xs for xs, _ in sources.values() if 0 < len(xs) <= MAX_MARKED_POINTS and regular_grid(xs) is None]
    value_range = np.nanpercentile(np.concatenate([y, m]), [1, 99]) if len(y) else (0.0, 1.0)
    e_max = float(np.nanmax(np.abs(err))) if len(err) else 1.0

    panels = [
        ("target values", y, {"cmap": "viridis", "vmin": value_range[0], "vmax": value_range[1]}),
        ("predictive mean", m, {"cmap": "viridis", "vmin": value_range[0], "vmax": value_range[1]}),
        ("predictive std", s, {"cmap": "magma", "vmin": 0.0}),
        ("error (mean - target)", err, {"cmap": "RdBu_r", "vmin": -e_max, "vmax": e_max}),
        ("standardised error (target - mean) / std", z, {"cmap": "RdBu_r", "vmin": -3.0, "vmax": 3.0}),
    ]
    ncols = 3
    nrows = math.ceil((len(panels) + len(sources)) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows), layout="constrained")
    for i, (name, values, style) in enumerate(panels, start=1):
        ax, place = _map_axes(fig, nrows, ncols, i, geographic)
        artist = _draw_field(ax, x, values, geographic, place, **style)
        fig.colorbar(artist, ax=ax, shrink=0.85)
        for xs in marked:
            _mark(ax, xs, geographic, place)
        ax.set_title(name, fontsize=9)
    for j, (name, (xs, obs)) in enumerate(sources.items(), start=len(panels) + 1):
        ax, place = _map_axes(fig, nrows, ncols, j, geographic)
        values = _numpy(obs.y[0, :, 0])[_numpy(obs.mask[0]).astype(bool)]
        if len(xs):
            style = {"cmap": "viridis", "vmin": value_range[0], "vmax": value_range[1]}
            fig.colorbar(_draw_field(ax, xs, values, geographic, place, **style), ax=ax, shrink=0.85)
        ax.set_title(f"context {name!r} ({len(xs):,} points)", fontsize=9)
    fig.suptitle(title or f"task {index}: {len(y):,} targets")
    return fig


def plot_standardised_errors(z: Tensor | np.ndarray, bins: int = 60, title: str = "") -> Figure:
    """Histogram (density) of standardised errors ``z`` (any shape, NaN ignored) against the N(0, 1) density."""
    values = np.asarray(z.detach().float().cpu() if isinstance(z, Tensor) else z, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    limit = max(4.0, float(np.percentile(np.abs(values), 99.5)) if len(values) else 4.0)
    ax.hist(values, bins=bins, range=(-limit, limit), density=True, alpha=0.6, label=f"{len(values):,} targets")
    grid = np.linspace(-limit, limit, 400)
    ax.plot(grid, np.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi), "k", lw=1.2, label="N(0, 1)")
    if len(values):
        inside = float(np.mean(np.abs(values) <= 1.6448536))
        ax.set_title(
            title or f"standardised errors: mean {values.mean():.2f}, std {values.std():.2f}, 90 % {inside:.2f}"
        )
    ax.set_xlabel("(target - mean) / std")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    return fig


#: Nominal coverages of the reliability diagram's central intervals.
RELIABILITY_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def interval_coverage(z: Tensor | np.ndarray, levels: tuple[float, ...] = RELIABILITY_LEVELS) -> np.ndarray:
    """Observed share of standardised errors ``z`` (any shape, NaN ignored) inside each central interval ``[L]``."""
    values = np.asarray(z.detach().float().cpu() if isinstance(z, Tensor) else z, dtype=np.float64).ravel()
    values = np.abs(values[np.isfinite(values)])
    halfwidths = np.array([central_interval_halfwidth(level) for level in levels])
    return (values[None, :] <= halfwidths[:, None]).mean(1) if len(values) else np.full(len(levels), np.nan)


def plot_reliability(errors: dict[str, Tensor | np.ndarray], title: str = "") -> Figure:
    """Reliability diagram of Gaussian predictives from their standardised errors ``{label: z}``: observed against
    nominal coverage of the central intervals (``RELIABILITY_LEVELS``; on the diagonal when calibrated, below it
    when over-confident) and the PIT histogram ``Phi(z)`` (flat when calibrated, U-shaped when over-confident)."""
    fig = Figure(figsize=(9.5, 4.0), layout="constrained")
    ax, pit = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    levels = np.array(RELIABILITY_LEVELS)
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
    for label, z in errors.items():
        values = np.asarray(z.detach().float().cpu() if isinstance(z, Tensor) else z, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        covered = interval_coverage(values)
        z2 = float(np.mean(values**2)) if len(values) else float("nan")
        ax.plot(levels, covered, "o-", ms=4, label=f"{label}: mean z^2 {z2:.2f}, 90 % -> {covered[8]:.2f}")
        u = 0.5 * (1.0 + np.vectorize(math.erf)(values / math.sqrt(2.0))) if len(values) else values
        pit.hist(u, bins=20, range=(0, 1), density=True, histtype="step", lw=1.5, label=label)
    ax.set_xlabel("nominal coverage of the central interval")
    ax.set_ylabel("observed coverage")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    pit.axhline(1.0, color="k", ls="--", lw=1)
    pit.set_xlabel("PIT = Phi((target - mean) / std)")
    pit.set_ylabel("density")
    pit.legend(fontsize=7)
    count = max((np.isfinite(np.asarray(z)).sum() for z in errors.values()), default=0)
    fig.suptitle(title or f"reliability of {count:,} targets")
    return fig


def standardised_errors(batch: Batch, dist: Distribution) -> Tensor:
    """``(y - mean) / std`` of every valid target of the batch, flattened ``[P * Dy]``, on the CPU."""
    valid = batch.target.valid()
    z = (batch.target.y.float() - dist.mean.float()) / dist.stddev.float()
    return z[valid].flatten().detach().cpu()


def evaluation_figures(
    predict: Predictor,
    batch: Batch,
    num_tasks: int = 2,
    geographic: bool = False,
    posterior: Callable[[Batch, Tensor], tuple[Tensor, Tensor] | None] | None = None,
    first_index: int = 0,
) -> dict[str, Figure]:
    """Figures of one batch by name: ``task<i>`` for the first ``num_tasks`` tasks (a 1-D plot for ``Dx = 1``, maps
    for ``Dx = 2``, nothing for higher dimensions) and ``standardised_errors`` over the whole batch.
    ``first_index`` offsets the task numbers in the names."""
    with torch.no_grad():
        dist = predict(batch.context, batch.target.x)
    figures = {"standardised_errors": plot_standardised_errors(standardised_errors(batch, dist))}
    dim_x = batch.target.x.shape[-1]
    for i in range(min(num_tasks, batch.batch_size)):
        name = f"task{first_index + i:03d}"
        if dim_x == 1:
            figures[name] = plot_gp1d(predict, batch, i, posterior)
        elif dim_x == 2:
            figures[name] = plot_map(batch, dist.mean, dist.stddev, i, geographic, f"task {first_index + i}")
    return figures


def is_geographic(datamodule: Any) -> bool:
    """Whether a DataModule's inputs are ``(latitude, longitude)`` in degrees: its ``geographic`` attribute."""
    return bool(optional(datamodule, "geographic"))


def oracle_posterior(datamodule: Any) -> Callable[[Batch, Tensor], tuple[Tensor, Tensor] | None] | None:
    """The task's true posterior (``task.posterior``, e.g. the 1-D GP's), if the DataModule's task has one."""
    return task_posterior(datamodule)


# ----------------------------------------------------------------------------------------------------- callback


class PlotCallback(L.Callback):
    """Logs ``evaluation_figures`` of the first validation batch to TensorBoard (``val_plots/<name>``) every
    ``every_n_validations`` validation runs (0 disables it); does nothing without a TensorBoard logger.

    Cost: one extra forward pass on a dense 1-D grid per plotted task and a few matplotlib figures, on rank 0.

    Args:
        every_n_validations: plot at every n-th validation run (not counting the sanity check); 0: never.
        num_tasks: tasks of the first validation batch to draw.
        geographic: inputs are (latitude, longitude) in degrees; None asks the DataModule (``is_geographic``).
    """

    def __init__(self, every_n_validations: int = 1, num_tasks: int = 2, geographic: bool | None = None) -> None:
        if every_n_validations < 0 or num_tasks < 0:
            raise ValueError(
                f"PlotCallback: every_n_validations and num_tasks must be >= 0; got {every_n_validations}, {num_tasks}."
            )
        self.every_n_validations, self.num_tasks, self.geographic = every_n_validations, num_tasks, geographic
        self.validations = 0

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations += 1

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        n = self.every_n_validations
        if batch_idx or dataloader_idx or trainer.sanity_checking or not trainer.is_global_zero or n == 0:
            return
        if self.validations % n or not isinstance(batch, Batch):
            return
        writer = _tensorboard(trainer)
        if writer is None:
            return
        datamodule = getattr(trainer, "datamodule", None)
        geographic = is_geographic(datamodule) if self.geographic is None else self.geographic
        predict = getattr(pl_module, "model", pl_module)
        figures = evaluation_figures(predict, batch, self.num_tasks, geographic, oracle_posterior(datamodule))
        for name, fig in figures.items():
            writer.add_figure(f"val_plots/{name}", fig, global_step=trainer.global_step, close=True)


def _tensorboard(trainer: L.Trainer) -> Any | None:
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None
