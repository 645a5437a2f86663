"""Calibration figures of standardised errors ``z = (mean - y) / std`` (the sign of the error maps): histograms
against N(0, 1), reliability diagrams (interval coverage against the nominal level) and PIT histograms, pooled and
per group of targets (held-out, context); ``standardised_errors(batch, dist)`` gives ``z`` of a batch's valid
targets. Figures are built without ``pyplot``, as in ``gridtnp.report.plots``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.distributions import Distribution

from gridtnp.batch import Batch
from gridtnp.metrics import central_interval_halfwidth


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
    ax.set_xlabel("z = (mean - truth) / std")
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
    """``Phi(z)``: called with ``(truth - mean) / std``, the probability integral transform."""
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
        reliability.plot([0, 1], [0, 1], "k--", lw=1, label="ideal (coverage = nominal)")
        count = 0
        for k, (label, z) in enumerate(groups[group].items()):
            values = _finite(z)
            count = max(count, len(values))
            covered = interval_coverage(values)
            z2 = float(np.mean(values**2)) if len(values) else float("nan")
            text = f"{label}: 90 % -> {covered[RELIABILITY_LEVELS.index(0.9)]:.2f}, mean z^2 {z2:.2f}"
            reliability.plot(levels, covered, "o-", ms=4, color=f"C{k}", label=text)
            pit.hist(_pit(-values), bins=20, range=(0, 1), density=True, histtype="step", lw=1.5, color=f"C{k}")
            hist.hist(values, bins=60, range=(-4, 4), density=True, histtype="step", lw=1.5, color=f"C{k}")
        reliability.set_title(f"{group} targets ({count:,})", fontsize=10)
        reliability.set_xlabel("nominal coverage of the central interval")
        reliability.set_ylabel("observed coverage")
        reliability.set_xlim(0, 1)
        reliability.set_ylim(0, 1)
        reliability.legend(fontsize=7, loc="upper left")
        pit.axhline(1.0, color="k", ls="--", lw=1, label="ideal (flat)")
        pit.set_title(f"{group}: PIT histogram", fontsize=9)
        pit.set_xlabel("PIT = Phi((truth - mean) / std) = Phi(-z)")
        pit.legend(fontsize=7)
        pit.set_ylabel("density")
        hist.plot(grid, np.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi), "k--", lw=1.0, label="ideal: N(0, 1)")
        hist.set_title(f"{group}: standardised errors", fontsize=9)
        hist.set_xlabel("z = (mean - truth) / std")
        hist.set_ylabel("density")
        hist.legend(fontsize=7)
    fig.suptitle(title or "calibration")
    return fig


def plot_reliability(errors: dict[str, Tensor | np.ndarray], title: str = "") -> Figure:
    """``plot_calibration`` of one group: standardised errors ``{label: z}`` of all targets pooled."""
    return plot_calibration({"all": errors}, title)


def standardised_errors(batch: Batch, dist: Distribution) -> Tensor:
    """``(mean - y) / std`` of every valid target of the batch, flattened ``[P * Dy]``, on the CPU."""
    valid = batch.target.valid()
    z = (dist.mean.float() - batch.target.y.float()) / dist.stddev.float()
    return z[valid].flatten().detach().cpu()
