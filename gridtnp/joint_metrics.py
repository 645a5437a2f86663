"""Scores of the joint predictive over a task's targets: energy and variogram scores, the regional mean's calibration.

Per-point metrics (``gridtnp.metrics``) read only the marginals; these read the predictive of all valid targets
of a task together, from samples (``gridtnp.nn.lowrank_normal.draw_samples``: joint for a ``LowRankNormal``,
independent for a ``Normal``), so the two kinds of likelihood are scored alike. Each is a value per task, then a
mean over tasks (``TaskMean``; tasks without a valid target are left out). Normalised units. With ``M`` samples
``X_m`` of the task's ``K`` valid components (targets times ``Dy``) and the observation ``y``:

* ``energy_score``: ``mean_m ||X_m - y|| - sum_{m != m'} ||X_m - X_m'|| / (2 M (M - 1))`` (Gneiting & Raftery
  2007, the unbiased estimator); lower is better, the CRPS for ``K = 1``;
* ``variogram_score``: ``(|y_i - y_j|^p - mean_m |X_mi - X_mj|^p)^2`` of order ``p = 0.5`` (Scheuerer & Hamill
  2015), averaged over the ordered pairs ``i != j`` (not summed, so tasks of any size compare), over at most
  ``VARIOGRAM_POINTS`` components per task (a fixed random subset beyond);
* ``joint_loglik``: the task's joint log-density per valid target point (the training objective; the mean of the
  marginal log-densities for an independent predictive);
* ``regional_mean_coverage_90``: whether the weighted mean of ``y`` over the task's targets (the point weights:
  cos(latitude) where the module weights by it) lies in the central 90 % interval of the predictive of that mean
  (Gaussian, exact from the covariance: ``w^T C w / (sum w)^2``), averaged over ``Dy``; 0.9 when calibrated;
* ``regional_mean_crps``: the closed-form CRPS of that Gaussian at the observed regional mean.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.distributions import Normal

from gridtnp.metrics import TaskMean, central_interval_halfwidth, gaussian_crps
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.nn.lowrank_normal import LowRankNormal, draw_samples

#: Most components per task in the variogram score (its pairs are ``K^2`` per sample).
VARIOGRAM_POINTS = 2048
#: Seed of the samples the scores are computed from (the same for every batch: reproducible test metrics).
SEED = 0
JOINT_METRICS = (
    "energy_score",
    "variogram_score",
    "joint_loglik",
    "regional_mean_coverage_90",
    "regional_mean_crps",
)


def _flat(values: Tensor, valid: Tensor) -> Tensor:
    """``values [..., B, N, Dy]`` -> ``[..., B, N Dy]`` with invalid targets (``valid [B, N]``) zeroed."""
    values = torch.where(valid.unsqueeze(-1), values.float(), 0.0)
    return values.flatten(-2)


def energy_score(samples: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Energy score ``[B]`` of ``samples [M, B, N, Dy]`` (M >= 2) at ``y [B, N, Dy]`` over the ``valid [B, N]``
    targets."""
    x = _flat(samples, valid).transpose(0, 1)  # [B, M, K]
    obs = _flat(y, valid)  # [B, K]
    m = x.shape[1]
    to_obs = (x - obs.unsqueeze(1)).norm(dim=-1).mean(-1)
    spread = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").sum((-2, -1)) / (2 * m * (m - 1))
    return to_obs - spread


def variogram_score(samples: Tensor, y: Tensor, valid: Tensor, p: float = 0.5, generator=None) -> Tensor:
    """Variogram score of order ``p`` ``[B]``, the mean over ordered pairs of valid components (see the module)."""
    x, obs = _flat(samples, valid), _flat(y, valid)  # [M, B, K], [B, K]
    ok = valid.unsqueeze(-1).expand(*valid.shape, y.shape[-1]).flatten(-2)  # [B, K]
    if ok.shape[-1] > VARIOGRAM_POINTS:
        keep = torch.randperm(ok.shape[-1], generator=generator, device="cpu")[:VARIOGRAM_POINTS].to(ok.device)
        x, obs, ok = x[..., keep], obs[..., keep], ok[..., keep]
    observed = (obs.unsqueeze(-1) - obs.unsqueeze(-2)).abs().pow(p)  # [B, K, K]
    expected = torch.zeros_like(observed)
    for sample in x:  # one [B, K, K] at a time: memory independent of the number of samples
        expected += (sample.unsqueeze(-1) - sample.unsqueeze(-2)).abs().pow(p)
    expected /= x.shape[0]
    pairs = (ok.unsqueeze(-1) & ok.unsqueeze(-2)).float()
    pairs = pairs * (1 - torch.eye(ok.shape[-1], device=ok.device))
    return ((observed - expected).square() * pairs).sum((-2, -1)) / pairs.sum((-2, -1)).clamp_min(1.0)


def regional_mean(dist: Normal, y: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Predictive mean and std ``[B, Dy]`` of the ``weight``-ed mean (``[B, N]``) over the targets, and the
    observed one from ``y [B, N, Dy]``."""
    w = weight.float() / weight.float().sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    ok = (weight > 0).unsqueeze(-1)
    observed = (torch.where(ok, y.float(), 0.0) * w.unsqueeze(-1)).sum(1)
    mean = (torch.where(ok, dist.mean.float(), 0.0) * w.unsqueeze(-1)).sum(1)
    if isinstance(dist, LowRankNormal):
        shared = (torch.where(ok.unsqueeze(-1), dist.factor, 0.0) * w[..., None, None]).sum(1)  # [B, Dy, R]
        own = torch.where(ok, dist.diag, 0.0)
        var = shared.square().sum(-1) + (own * w.unsqueeze(-1).square()).sum(1)
    else:
        var = (torch.where(ok, dist.stddev.float(), 0.0).square() * w.unsqueeze(-1).square()).sum(1)
    return mean, var.clamp_min(torch.finfo(torch.float32).tiny).sqrt(), observed


class JointScores(nn.Module):
    """The joint metrics of one evaluation stage (``JOINT_METRICS``), from ``samples`` draws per task."""

    def __init__(self, samples: int = 32) -> None:
        super().__init__()
        if samples < 2:
            raise ValueError(f"score_samples must be >= 2 (the energy score compares pairs of samples); got {samples}.")
        self.samples = samples
        self.metrics = nn.ModuleDict({name: TaskMean() for name in JOINT_METRICS})
        self.halfwidth = central_interval_halfwidth(0.9)

    @torch.no_grad()
    def scores(self, dist: Normal, y: Tensor, weight: Tensor) -> dict[str, Tensor]:
        """Per-task values ``[B]`` of every joint metric for predictive ``dist [B, N, Dy]``, ``y``, ``weight``."""
        valid = weight > 0
        generator = torch.Generator(device=dist.mean.device).manual_seed(SEED)
        samples = draw_samples(dist, self.samples, generator)
        mean, std, observed = regional_mean(dist, y, weight)
        inside = ((observed - mean).abs() <= self.halfwidth * std).float().mean(-1)
        return {
            "energy_score": energy_score(samples, y, valid),
            "variogram_score": variogram_score(samples, y, valid, generator=torch.Generator().manual_seed(SEED)),
            "joint_loglik": log_likelihood(dist, y, valid),
            "regional_mean_coverage_90": inside,
            "regional_mean_crps": gaussian_crps(mean, std, observed).mean(-1),
        }

    def update_and_log(self, module: nn.Module, stage: str, dist: Normal, y: Tensor, weight: Tensor) -> None:
        """Update the metrics with a batch and log them as ``{stage}/{name}`` through the LightningModule ``module``."""
        has_target = (weight > 0).any(-1)
        for name, values in self.scores(dist, y, weight).items():
            self.metrics[name].update(values, has_target)
            module.log(f"{stage}/{name}", self.metrics[name], batch_size=y.shape[0])


__all__ = ["JOINT_METRICS", "JointScores", "energy_score", "regional_mean", "variogram_score"]
