"""Evaluation metrics of a Gaussian predictive as torchmetrics ``Metric`` classes (sums as states: exact under DDP).

Inputs everywhere: predictive ``mean, std [B, N, Dy]``, observations ``y [B, N, Dy]`` and point weights
``weight [B, N]`` (0 for padded or missing targets; ``point_weights`` builds them, optionally ``cos(latitude)``).
Padded or NaN entries of ``y`` never reach a sum. Point metrics pool every (task, point, output dimension) with
its weight; the log-likelihood is a per-task mean per target point, then a mean (and standard error) over tasks,
the same quantity the training loss is the negative of.

Every state is a sum with ``dist_reduce_fx="sum"``, so merging the states of two ranks (or two halves of a test
set) gives exactly the metric of their union, whatever the batch sizes.

Closed forms for ``z = (y - mean) / std``:

* CRPS of ``N(mean, std^2)`` (Gneiting & Raftery 2007, eq. 21): ``std * (z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi))``;
* calibration: mean ``log phi(z)``, ``-(log(2 pi) + 1) / 2 = -1.4189`` in expectation for a calibrated model
  (higher: the predictive is too wide; lower: too narrow); mean ``z^2``, 1 for a calibrated model (above 1: too
  narrow, below: too wide);
* log-likelihood in physical units: ``y_phys = scale * y`` has density ``p(y) / scale``, so per target point the
  normalised log-density minus ``Dy log(scale)``;
* coverage of the central ``p`` interval: the share of ``|z| <= Phi^-1((1 + p) / 2)``, ``p`` when calibrated.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

#: Expected log-density of a standard normal draw under N(0, 1): what ``StandardisedLogDensity`` gives when calibrated.
CALIBRATED_LOG_DENSITY = -0.5 * (math.log(2 * math.pi) + 1.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def point_weights(mask: Tensor, x: Tensor | None = None, latitude_dim: int | None = None) -> Tensor:
    """Weights ``[B, N]``: ``mask`` as float, times ``cos(latitude)`` when ``latitude_dim`` is a column of ``x``.

    ``x [B, N, Dx]`` holds latitudes in degrees in column ``latitude_dim``; cells near the poles cover less area, so
    area-weighted scores weight each point by ``cos(lat)`` (clamped at 0 for latitudes beyond +-90).
    """
    weight = mask.float()
    if latitude_dim is None:
        return weight
    if x is None or not -x.shape[-1] <= latitude_dim < x.shape[-1]:
        dims = "no x" if x is None else f"x with {x.shape[-1]} column(s)"
        raise ValueError(f"cos(latitude) weighting: latitude_dim {latitude_dim} is not a column of {dims}.")
    lat = torch.where(mask, x[..., latitude_dim].float(), 0.0)  # padded x may be NaN
    return weight * torch.cos(torch.deg2rad(lat)).clamp_min(0.0)


def standardised_errors(mean: Tensor, std: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    """``z = (y - mean) / std`` ``[B, N, Dy]`` in float32, 0 where ``weight`` is 0 (padded or NaN ``y``)."""
    ok = (weight > 0).unsqueeze(-1)
    y = torch.where(ok, y.float(), mean.float())
    return torch.where(ok, (y - mean.float()) / std.float(), 0.0)


def gaussian_crps(mean: Tensor, std: Tensor, y: Tensor) -> Tensor:
    """Closed-form CRPS of ``N(mean, std^2)`` at ``y`` (same shapes, broadcastable); lower is better."""
    z = (y - mean) / std
    pdf = torch.exp(-0.5 * z.square() - _LOG_SQRT_2PI)
    cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    return std * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))


def standard_normal_log_density(z: Tensor) -> Tensor:
    """``log N(z; 0, 1)`` elementwise."""
    return -0.5 * z.square() - _LOG_SQRT_2PI


def central_interval_halfwidth(level: float) -> float:
    """``Phi^-1((1 + level) / 2)``: the central ``level`` interval of N(0, 1) is ``[-h, h]`` (0.6745 for 0.5)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"coverage level must be in (0, 1); got {level}.")
    return math.sqrt(2.0) * torch.erfinv(torch.tensor(level, dtype=torch.float64)).item()


def task_log_likelihood(mean: Tensor, std: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    """Weighted mean over points of the Gaussian log-density (summed over ``Dy``) per task: ``[B]``, 0 if no target."""
    z = standardised_errors(mean, std, y, weight)
    logp = (standard_normal_log_density(z) - torch.log(std.float())).sum(-1)  # [B, N]
    logp = torch.where(weight > 0, logp, 0.0)
    return (logp * weight).sum(-1) / weight.sum(-1).clamp_min(torch.finfo(torch.float32).tiny)


class TaskMean(Metric):
    """Mean over tasks of per-task values ``[B]`` (tasks with ``valid`` False are skipped); DDP: summed states."""

    full_state_update = False
    higher_is_better: bool | None = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total_sq", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor, valid: Tensor | None = None) -> None:
        """Add per-task ``values [B]``; ``valid [B]`` (bool) drops tasks, e.g. those without a target."""
        values = values.detach().double().flatten()
        keep = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.flatten()
        values = torch.where(keep, values, 0.0)
        self.total += values.sum()
        self.total_sq += values.square().sum()
        self.count += keep.sum()

    def compute(self) -> Tensor:
        return (self.total / self.count).float()


class TaskStandardError(TaskMean):
    """Standard error of the mean over tasks, ``sqrt(s^2 / n)`` with the unbiased variance ``s^2``."""

    def compute(self) -> Tensor:
        n = self.count
        if n < 2:  # undefined from fewer than two tasks
            return torch.tensor(float("nan"), device=n.device)
        var = (self.total_sq - self.total.square() / n) / (n - 1)
        return (var.clamp_min(0.0) / n).sqrt().float()


class LogLikelihood(TaskMean):
    """Mean over tasks of the mean Gaussian log-density per target point (``Dy`` summed); higher is better."""

    higher_is_better = True

    def update(self, mean: Tensor, std: Tensor, y: Tensor, weight: Tensor) -> None:  # type: ignore[override]
        super().update(task_log_likelihood(mean, std, y, weight), weight.sum(-1) > 0)


class LogLikelihoodStandardError(TaskStandardError):
    """Standard error over tasks of :class:`LogLikelihood`."""

    def update(self, mean: Tensor, std: Tensor, y: Tensor, weight: Tensor) -> None:  # type: ignore[override]
        super().update(task_log_likelihood(mean, std, y, weight), weight.sum(-1) > 0)


class PhysicalLogLikelihood(TaskMean):
    """:class:`LogLikelihood` with ``y`` in physical units (``y * scale``): minus ``Dy log(scale)`` per target."""

    higher_is_better = True

    def update(  # type: ignore[override]
        self, mean: Tensor, std: Tensor, y: Tensor, weight: Tensor, scale: Tensor | None = None
    ) -> None:
        """``mean, std, y [B, N, Dy]``, ``weight [B, N]``, ``scale [B]`` (physical units per normalised unit; None:
        1, the normalised log-likelihood)."""
        loglik = task_log_likelihood(mean, std, y, weight).double()
        if scale is not None:
            loglik = loglik - torch.log(scale.detach().double().abs()).flatten() * y.shape[-1]
        super().update(loglik, weight.sum(-1) > 0)


class WeightedMean(Metric):
    """Weighted mean of values, ``sum(w v) / sum(w)``; DDP: summed states."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor, weight: Tensor | None = None) -> None:
        """Add ``values`` with ``weight`` (broadcast to ``values``; default 1); zero-weight entries are ignored."""
        values = values.detach().double()
        weight = torch.ones_like(values) if weight is None else weight.detach().double().expand_as(values)
        self.total += torch.where(weight > 0, values * weight, 0.0).sum()
        self.weight += weight.sum()

    def compute(self) -> Tensor:
        return (self.total / self.weight).float()


class RootWeightedMean(WeightedMean):
    """Square root of a weighted mean, e.g. an RMSE from squared errors."""

    def compute(self) -> Tensor:
        return super().compute().sqrt()


class GaussianPointMetric(WeightedMean):
    """Base of the point metrics: a weighted mean over (task, point, output dimension) of ``point_values``.

    ``scale [B]`` (optional) converts to physical units: ``y``, ``mean`` and ``std`` are multiplied by it
    (``power`` says how a value scales: 1 for errors and CRPS, 2 for squared errors, 0 for scale-free ones).
    """

    power = 1

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        raise NotImplementedError

    def update(  # type: ignore[override]
        self, mean: Tensor, std: Tensor, y: Tensor, weight: Tensor, scale: Tensor | None = None
    ) -> None:
        """``mean, std, y [B, N, Dy]``, ``weight [B, N]``, ``scale [B]`` or None (normalised units)."""
        mean, std = mean.detach().float(), std.detach().float()
        z = standardised_errors(mean, std, y, weight)
        y = torch.where((weight > 0).unsqueeze(-1), y.float(), mean)
        values = self.point_values(mean, std, y, z)
        if scale is not None and self.power:
            values = values * scale.detach().float().view(-1, 1, 1).abs() ** self.power
        super().update(values, weight.unsqueeze(-1))


class RMSE(GaussianPointMetric):
    """Root mean squared error of the predictive mean."""

    power, higher_is_better = 2, False

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return (y - mean).square()

    def compute(self) -> Tensor:
        return super().compute().sqrt()


class MAE(GaussianPointMetric):
    """Mean absolute error of the predictive mean."""

    power, higher_is_better = 1, False

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return (y - mean).abs()


class CRPS(GaussianPointMetric):
    """Mean closed-form CRPS of the Gaussian predictive (:func:`gaussian_crps`); lower is better."""

    power, higher_is_better = 1, False

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return gaussian_crps(mean, std, y)


class StandardisedLogDensity(GaussianPointMetric):
    """Mean ``log N(z; 0, 1)`` of the standardised errors: ``CALIBRATED_LOG_DENSITY`` (-1.419) when calibrated."""

    power = 0

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return standard_normal_log_density(z)


class MeanSquaredStandardisedError(GaussianPointMetric):
    """Mean ``z^2`` of the standardised errors: 1 when calibrated, above 1 when over-confident (too narrow)."""

    power = 0

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return z.square()


class StandardisedSquareByOutput(Metric):
    """Weighted mean of ``z^2`` per output dimension, ``[Dy]``: the variance calibration's ``s^2``; summed states."""

    full_state_update = False

    def __init__(self, dim_y: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(dim_y, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, mean: Tensor, std: Tensor, y: Tensor, weight: Tensor) -> None:
        """``mean, std, y [B, N, Dy]``, ``weight [B, N]``."""
        z = standardised_errors(mean.detach(), std.detach(), y, weight).double()  # [B, N, Dy], 0 where weight is 0
        w = weight.detach().double()
        self.total += (z.square() * w.unsqueeze(-1)).sum((0, 1))
        self.weight += w.sum()

    def compute(self) -> Tensor:
        return self.total / self.weight


class IntervalCoverage(GaussianPointMetric):
    """Share of targets inside the central ``level`` predictive interval; ``level`` when calibrated."""

    power = 0

    def __init__(self, level: float = 0.9, **kwargs) -> None:
        super().__init__(**kwargs)
        self.level = level
        self.halfwidth = central_interval_halfwidth(level)

    def point_values(self, mean: Tensor, std: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return (z.abs() <= self.halfwidth).float()


def evaluation_metrics() -> dict[str, Metric]:
    """The metrics of one evaluation stage, by logged name (without the ``stage/`` prefix).

    ``*_physical`` (``loglik_physical`` included) and ``baseline_rmse_physical`` are only updated when a batch has
    ``extras["target_scale"]`` (and ``extras["coarse_sq_err"]``), ``oracle_loglik`` when it has
    ``extras["oracle_loglik"]``.
    """
    return {
        "loglik": LogLikelihood(),
        "loglik_stderr": LogLikelihoodStandardError(),
        "loglik_physical": PhysicalLogLikelihood(),
        "rmse": RMSE(),
        "mae": MAE(),
        "crps": CRPS(),
        "calibration_logdensity": StandardisedLogDensity(),
        "mean_z2": MeanSquaredStandardisedError(),
        "coverage_50": IntervalCoverage(0.5),
        "coverage_90": IntervalCoverage(0.9),
        "rmse_physical": RMSE(),
        "mae_physical": MAE(),
        "crps_physical": CRPS(),
        "oracle_loglik": TaskMean(),
        "baseline_rmse_physical": RootWeightedMean(),
    }


def monitored_direction(module: torch.nn.Module, monitor: str) -> bool | None:
    """Whether higher is better for the logged metric ``monitor`` (``"val/heldout/rmse"``), as the metric says.

    The metric objects are ``module``'s torchmetrics submodules whose own name is the last part of ``monitor``
    (``...["rmse"]`` for ``val/heldout/rmse``); their ``higher_is_better`` answers. None when no such metric declares
    it, or when those found disagree.
    """
    name = monitor.rsplit("/", 1)[-1]
    found = {
        metric.higher_is_better
        for qualified, metric in module.named_modules()
        if isinstance(metric, Metric) and qualified.rsplit(".", 1)[-1] == name
    } - {None}
    return found.pop() if len(found) == 1 else None


#: Metrics that need the predictive and targets (the rest are fed from ``Batch.extras``).
PREDICTIVE_METRICS = ("loglik", "loglik_stderr", "rmse", "mae", "crps", "calibration_logdensity", "mean_z2")
COVERAGE_METRICS = ("coverage_50", "coverage_90")
PHYSICAL_METRICS = ("loglik_physical", "rmse_physical", "mae_physical", "crps_physical")

__all__ = [
    "CALIBRATED_LOG_DENSITY",
    "CRPS",
    "MAE",
    "RMSE",
    "GaussianPointMetric",
    "IntervalCoverage",
    "LogLikelihood",
    "LogLikelihoodStandardError",
    "MeanSquaredStandardisedError",
    "PhysicalLogLikelihood",
    "RootWeightedMean",
    "StandardisedLogDensity",
    "StandardisedSquareByOutput",
    "TaskMean",
    "TaskStandardError",
    "WeightedMean",
    "evaluation_metrics",
    "gaussian_crps",
    "monitored_direction",
    "point_weights",
    "task_log_likelihood",
]
