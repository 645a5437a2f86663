"""Samples of a joint predictive over a few hours of a split, in the truth's units, and their regional means.

A joint likelihood (``lowrank_gaussian``, ``gridtnp.nn.lowrank_normal.LowRankNormal``) gives the targets of a task a
covariance, so a sample is a coherent map and the mean of a sample over the stations (the regional mean) has the
spread of the predictive of that mean. ``gridtnp report`` draws both (``gridtnp.report.joint_plots``).

* ``draw_joint_samples(module, datamodule, batch, count, seed)``: ``count`` joint samples and as many independent
  ones (from the marginals alone) per task of ``batch``, from the model's calibrated predictive, converted as
  ``gridtnp predict`` converts a sample (the DataModule's ``predictions_to_xarray``); None for an independent
  predictive.
* ``JointSamples.regional(values)``: the weighted mean over each hour's targets; ``regional_std()`` the std of its
  predictive, exact from the covariance (or from the marginals alone); ``low_rank_share()`` how much of a target's
  variance the low-rank part holds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Normal

from gridtnp.batch import Batch
from gridtnp.data.contract import optional
from gridtnp.metrics import point_weights
from gridtnp.nn.lowrank_normal import LowRankNormal, draw_samples
from gridtnp.report.evaluation import variable_label

#: Samples per hour and the seed they are drawn with (the same report twice draws the same samples).
SAMPLES = 1000
SEED = 0


@dataclass
class JointSamples:
    """Per hour ``h`` of ``H`` and target ``s`` of ``S`` (stations in station order where the DataModule converts
    its outputs, else the task's targets): locations ``x [H, S, Dx]`` ((lat, lon) for stations), the truth
    ``observed``, the predictive ``mean`` and ``std [H, S]`` (NaN where not a target), ``joint`` and
    ``independent`` samples ``[M, H, S]``, the covariance's parts ``factor [R, H, S]`` and ``diag_std [H, S]``
    (``std^2 = sum_r factor^2 + diag_std^2``), ``weight [H, S]`` of the regional mean (cos(latitude) where the
    model weights its metrics by it, else 1; 0 where not a target), ``times`` (labels of the hours), ``label``
    (variable and units, ``"2 metre temperature [K]"``) and ``units``; all values in those units."""

    x: np.ndarray
    observed: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    joint: np.ndarray
    independent: np.ndarray
    factor: np.ndarray
    diag_std: np.ndarray
    weight: np.ndarray
    times: list[str]
    label: str
    units: str

    @property
    def hours(self) -> int:
        return int(self.mean.shape[0])

    @property
    def rank(self) -> int:
        return int(self.factor.shape[0])

    def regional(self, values: np.ndarray) -> np.ndarray:
        """The weighted mean over each hour's targets of ``values [..., H, S]`` -> ``[..., H]``."""
        filled = np.where(self.weight > 0, values, 0.0)
        return (filled * self.weight).sum(-1) / np.maximum(self.weight.sum(-1), np.finfo(np.float64).tiny)

    def regional_std(self, independent: bool = False) -> np.ndarray:
        """Std ``[H]`` of the predictive of the regional mean, exact from the covariance (``w^T C w / (sum w)^2``, as
        the ``regional_mean_coverage_90`` metric); ``independent``: from the marginals alone, as if the targets'
        errors were independent."""
        w = self.weight / np.maximum(self.weight.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
        own = np.where(self.weight > 0, self.std if independent else self.diag_std, 0.0)
        var = (w**2 * own**2).sum(-1)
        if not independent:
            shared = (np.where(self.weight > 0, self.factor, 0.0) * w).sum(-1)  # [R, H]
            var = var + (shared**2).sum(0)
        return np.sqrt(var)

    def low_rank_share(self) -> float:
        """The mean share of a target's predictive variance that its low-rank part (shared with the other targets)
        holds, over the targets of every hour."""
        valid = self.weight > 0
        shared = (self.factor**2).sum(0)
        return float(np.mean((shared / np.maximum(self.std**2, np.finfo(np.float64).tiny))[valid]))


def _repeated(out: dict[str, Tensor], k: int) -> dict[str, Tensor]:
    """Every per-task tensor ``[B, ...]`` of ``out`` repeated ``k`` times along the batch (row ``i * B + b``)."""
    return {key: v.repeat(k, *([1] * (v.dim() - 1))) if v.dim() else v for key, v in out.items()}


def _in_units(datamodule: Any, out: dict[str, Tensor], values: Tensor) -> Any:
    """``values [K, B, N]`` (each a field like ``out["mean"]``'s first output) through the DataModule's conversion in
    one call: an ``xarray.Dataset`` on ``(time, station)`` with ``K * B`` rows (sample-major), or None where the
    DataModule has no conversion to station values."""
    convert = optional(datamodule, "predictions_to_xarray")
    if convert is None or "hour" not in out:
        return None
    k = values.shape[0]
    rows = _repeated(out, k)
    rows["mean"] = values.reshape(-1, values.shape[-1]).unsqueeze(-1)
    rows["std"] = torch.ones_like(rows["mean"])
    try:
        ds = convert([rows])
    except (KeyError, ValueError, RuntimeError, IndexError) as err:
        warnings.warn(
            f"gridtnp: joint samples drawn in normalised units: {type(datamodule).__name__}.predictions_to_xarray "
            f"could not convert them ({type(err).__name__}: {err}).",
            stacklevel=2,
        )
        return None
    return ds if ds["mean"].dims == ("time", "station") else None  # forecast tasks: (init_time, lead_time, ...)


def draw_joint_samples(
    module: Any, datamodule: Any, batch: Batch, count: int = SAMPLES, seed: int = SEED
) -> JointSamples | None:
    """``count`` joint samples per task of ``batch`` (one hour each) from ``module``'s calibrated predictive, and
    ``count`` independent ones from its marginals (what an independent likelihood's samples look like), in the
    units the DataModule converts predictions to (``predictions_to_xarray``, as ``gridtnp predict`` converts
    samples; normalised units without one); the first output dimension. None where the predictive is not joint."""
    with torch.no_grad():
        dist = module(batch)
        if not isinstance(dist, LowRankNormal):
            return None
        calibrate = getattr(module, "calibrate", None)
        dist = calibrate(dist, batch) if callable(calibrate) else dist
        generator = torch.Generator(device=dist.mean.device).manual_seed(seed)
        joint = dist.draw(count, generator)[..., 0]  # [M, B, N]
        independent = draw_samples(Normal(dist.mean, dist.stddev), count, generator)[..., 0]
    target = batch.target
    out = {"mean": dist.mean, "x": target.x, "y": target.y, "mask": target.mask, **batch.extras}
    out = {k: v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu() for k, v in out.items()}
    mean = dist.mean[..., 0].float().cpu()  # [B, N]
    # Each part of the covariance added to the mean and converted as a sample is: an affine conversion (the
    # standardisation and the climatology added back) carries it into the truth's units.
    parts = [dist.stddev[..., 0], dist.diag[..., 0].sqrt(), *dist.factor[..., 0, :].movedim(-1, 0)]
    fields = torch.cat([mean[None], mean + torch.stack(parts).float().cpu(), joint.float().cpu(),
                        independent.float().cpu()])  # fmt: skip
    b, r = mean.shape[0], dist.rank
    ds = _in_units(datamodule, out, fields)
    latitude_dim = getattr(module, "latitude_dim", None)
    if ds is not None:
        values = ds["mean"].values.reshape(len(fields), b, -1)  # [3 + R + 2M, B, S]
        observed = ds["observed"].values[:b]
        lat, lon = ds["latitude"].values, ds["longitude"].values
        x = np.broadcast_to(np.stack([lat, lon], -1), (b, len(lat), 2))
        valid = np.isfinite(observed) & np.isfinite(values[0])
        weight = np.where(valid, np.cos(np.radians(lat)) if latitude_dim is not None else 1.0, 0.0)
        times = [np.datetime_as_string(t, unit="m").replace("T", " ") + " UTC" for t in ds["time"].values[:b]]
        label, units = variable_label(ds["mean"].attrs), str(ds["mean"].attrs.get("units", "")) or "normalised"
    else:
        valid_t = target.valid().cpu()
        values = np.where(valid_t.numpy()[None], fields.numpy(), np.nan)
        observed = np.where(valid_t.numpy(), target.y[..., 0].float().cpu().numpy(), np.nan)
        x = target.x.float().cpu().numpy()
        weight = point_weights(valid_t, target.x.float().cpu(), latitude_dim).numpy()
        times = [f"task {i}" for i in range(b)]
        label, units = "(normalised units)", "normalised"
    values = values.astype(np.float64)
    departures = values[1 : 3 + r] - values[0]
    return JointSamples(
        x=np.asarray(x, dtype=np.float64),
        observed=np.asarray(observed, dtype=np.float64),
        mean=values[0],
        std=departures[0],
        joint=values[3 + r : 3 + r + count],
        independent=values[3 + r + count :],
        factor=departures[2:],
        diag_std=departures[1],
        weight=np.asarray(weight, dtype=np.float64),
        times=times,
        label=label,
        units=units,
    )


__all__ = ["SAMPLES", "SEED", "JointSamples", "draw_joint_samples"]
