"""Evaluation metrics against closed forms, masking, cos(latitude) weighting and DDP-style state merging."""

from __future__ import annotations

import math
import os
import tempfile

import pytest
import torch
from torch.distributions import Normal

from gridtnp.metrics import (
    CALIBRATED_LOG_DENSITY,
    CRPS,
    MAE,
    RMSE,
    IntervalCoverage,
    LogLikelihood,
    LogLikelihoodStandardError,
    StandardisedLogDensity,
    evaluation_metrics,
    gaussian_crps,
    point_weights,
    task_log_likelihood,
)
from gridtnp.registry import ConfigError


def calibrated_draws(b: int = 64, n: int = 4096, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Predictive ``N(mean, std^2)`` per point and observations drawn from exactly that distribution."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(b, n, 1, generator=g)
    std = 0.1 + torch.rand(b, n, 1, generator=g)
    y = mean + std * torch.randn(b, n, 1, generator=g)
    return mean, std, y, torch.ones(b, n)


def run(metric, *args):
    metric.update(*args)
    return float(metric.compute())


def test_calibrated_gaussian_gives_the_known_values() -> None:
    mean, std, y, w = calibrated_draws()
    assert pytest.approx(-1.4189385, abs=1e-6) == CALIBRATED_LOG_DENSITY
    assert run(StandardisedLogDensity(), mean, std, y, w) == pytest.approx(CALIBRATED_LOG_DENSITY, abs=0.01)
    assert run(IntervalCoverage(0.5), mean, std, y, w) == pytest.approx(0.5, abs=0.005)
    assert run(IntervalCoverage(0.9), mean, std, y, w) == pytest.approx(0.9, abs=0.004)
    # For y ~ N(m, s^2): E[log N(y; m, s^2)] = -log s - (log 2 pi + 1) / 2, E[CRPS] = s / sqrt(pi),
    # E|y - m| = s sqrt(2 / pi).
    assert run(LogLikelihood(), mean, std, y, w) == pytest.approx(
        float(CALIBRATED_LOG_DENSITY - std.log().mean()), abs=0.01
    )
    assert run(CRPS(), mean, std, y, w) == pytest.approx(float(std.mean() / math.sqrt(math.pi)), rel=0.01)
    assert run(MAE(), mean, std, y, w) == pytest.approx(float(std.mean() * math.sqrt(2 / math.pi)), rel=0.01)
    assert run(RMSE(), mean, std, y, w) == pytest.approx(float(std.square().mean().sqrt()), rel=0.01)


def test_miscalibrated_predictives_move_the_calibration_metrics_the_right_way() -> None:
    mean, std, y, w = calibrated_draws(b=8, n=4096)
    for factor, direction in ((0.5, -1), (2.0, 1)):  # too narrow: lower log-density, less coverage; too wide: more
        logdens = run(StandardisedLogDensity(), mean, std * factor, y, w)
        cover = run(IntervalCoverage(0.9), mean, std * factor, y, w)
        assert direction * (cover - 0.9) > 0.05
        assert logdens < CALIBRATED_LOG_DENSITY - 0.05 if factor < 1 else logdens > CALIBRATED_LOG_DENSITY + 0.05


def test_exact_values_on_a_small_example() -> None:
    mean = torch.tensor([[[0.0], [1.0], [2.0]]])
    std = torch.tensor([[[1.0], [2.0], [0.5]]])
    y = torch.tensor([[[0.5], [-1.0], [2.0]]])
    w = torch.ones(1, 3)
    want_ll = Normal(mean, std).log_prob(y).mean()
    assert run(LogLikelihood(), mean, std, y, w) == pytest.approx(float(want_ll), abs=1e-6)
    z = (y - mean) / std
    assert run(StandardisedLogDensity(), mean, std, y, w) == pytest.approx(float(Normal(0, 1).log_prob(z).mean()))
    # |z| = 0.5, 1, 0: inside the 50 % interval (|z| <= 0.6745) for two of three points, inside 90 % for all.
    assert run(IntervalCoverage(0.5), mean, std, y, w) == pytest.approx(2 / 3)
    assert run(IntervalCoverage(0.9), mean, std, y, w) == pytest.approx(1.0)
    # CRPS at y = mean is s (sqrt 2 - 1) / sqrt pi.
    assert float(gaussian_crps(torch.tensor(2.0), torch.tensor(0.5), torch.tensor(2.0))) == pytest.approx(
        0.5 * (math.sqrt(2) - 1) / math.sqrt(math.pi), rel=1e-6
    )


def test_crps_matches_numerical_integration() -> None:
    """CRPS(F, y) = integral of (F(t) - 1[t >= y])^2 dt."""
    t = torch.linspace(-20, 20, 400_001, dtype=torch.float64)
    for m, s, obs in ((0.0, 1.0, 0.3), (1.5, 0.4, -0.7), (-2.0, 3.0, 4.0)):
        cdf = Normal(torch.tensor(m, dtype=torch.float64), s).cdf(t)
        integral = torch.trapezoid((cdf - (t >= obs).double()).square(), t)
        got = gaussian_crps(torch.tensor(m), torch.tensor(s), torch.tensor(obs))
        assert float(got) == pytest.approx(float(integral), rel=1e-4)


def test_padded_and_missing_targets_are_ignored() -> None:
    mean, std, y, _ = calibrated_draws(b=3, n=10)
    mask = torch.rand(3, 10) < 0.6
    mask[:, 0] = True
    y_bad = torch.where(mask.unsqueeze(-1), y, torch.nan)
    for name, metric in evaluation_metrics().items():
        if name in ("oracle_loglik", "baseline_rmse_physical", "loglik_stderr"):
            continue  # fed from extras; the standard error is checked below
        packed = fresh(metric)
        metric.update(mean, std, y_bad, mask.float())
        for i in range(3):  # the same points without padding, one task at a time
            keep = mask[i]
            packed.update(mean[i, keep][None], std[i, keep][None], y[i, keep][None], torch.ones(1, int(keep.sum())))
        torch.testing.assert_close(metric.compute(), packed.compute(), msg=name)
        assert torch.isfinite(metric.compute()), name


def test_physical_units_scale_errors_and_crps() -> None:
    mean, std, y, w = calibrated_draws(b=4, n=50)
    scale = torch.full((4,), 3.0)
    for cls in (RMSE, MAE, CRPS):
        assert run(cls(), mean, std, y, w, scale) == pytest.approx(3.0 * run(cls(), mean, std, y, w), rel=1e-5)
    # scale-free metrics ignore it
    assert run(IntervalCoverage(0.5), mean, std, y, w, scale) == run(IntervalCoverage(0.5), mean, std, y, w)


def test_cos_latitude_weighting() -> None:
    x = torch.tensor([[[0.0, 10.0], [60.0, -5.0], [90.0, 0.0], [0.0, 0.0]]])  # (lat, lon) in degrees
    mask = torch.tensor([[True, True, True, False]])
    w = point_weights(mask, x, latitude_dim=0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.5, 0.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(point_weights(mask, x), mask.float())
    err = torch.tensor([[[1.0], [4.0], [100.0], [100.0]]])
    mean = torch.zeros(1, 4, 1)
    rmse = run(RMSE(), mean, torch.ones_like(mean), err, w)
    assert rmse == pytest.approx(math.sqrt((1.0 + 0.5 * 16.0) / 1.5), rel=1e-6)
    # the per-task log-likelihood is the weighted mean over points
    ll = task_log_likelihood(mean, torch.ones_like(mean), err, w)
    logp = Normal(0.0, 1.0).log_prob(err[0, :2, 0])
    assert float(ll[0]) == pytest.approx(float((logp[0] + 0.5 * logp[1]) / 1.5), rel=1e-6)
    with pytest.raises(ValueError, match="latitude_dim 2"):
        point_weights(mask, x, latitude_dim=2)


def test_loglik_standard_error_over_tasks() -> None:
    mean, std, y, w = calibrated_draws(b=16, n=8)
    per_task = task_log_likelihood(mean, std, y, w)
    assert run(LogLikelihood(), mean, std, y, w) == pytest.approx(float(per_task.mean()), abs=1e-6)
    se = run(LogLikelihoodStandardError(), mean, std, y, w)
    assert se == pytest.approx(float(per_task.double().std() / 4.0), rel=1e-5)
    assert math.isnan(run(LogLikelihoodStandardError(), mean[:1], std[:1], y[:1], w[:1]))  # undefined for one task


def fresh(metric):
    """A new, empty metric of the same class and options."""
    return type(metric)(**({"level": metric.level} if isinstance(metric, IntervalCoverage) else {}))


def test_merged_states_equal_the_metric_over_the_union() -> None:
    """What DDP does at compute(): every state is summed over ranks, so uneven shards merge exactly."""
    mean, std, y, w = calibrated_draws(b=10, n=30)
    w = w * (torch.rand(10, 30) < 0.8)
    scale, values = torch.linspace(1.0, 2.0, 10), torch.rand(10)
    inputs = {
        "oracle_loglik": lambda s: (values[s],),
        "baseline_rmse_physical": lambda s: (values[s], scale[s]),
    }
    for name, whole in evaluation_metrics().items():
        args = inputs.get(name) or (
            (lambda s: (mean[s], std[s], y[s], w[s], scale[s]))
            if name.endswith("_physical")
            else (lambda s: (mean[s], std[s], y[s], w[s]))
        )
        first, second = fresh(whole), fresh(whole)
        whole.update(*args(slice(None)))
        first.update(*args(slice(None, 3)))
        second.update(*args(slice(3, None)))
        first.merge_state(second)
        torch.testing.assert_close(first.compute(), whole.compute(), msg=name)


def _ddp_worker(rank: int, path: str, result: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    mean, std, y, w = calibrated_draws(b=6, n=20)
    shard = slice(0, 2) if rank == 0 else slice(2, 6)  # uneven shards
    metrics = {
        "loglik": LogLikelihood(),
        "stderr": LogLikelihoodStandardError(),
        "crps": CRPS(),
        "cover": IntervalCoverage(0.5),
    }
    out = {}
    for name, metric in metrics.items():
        metric.update(mean[shard], std[shard], y[shard], w[shard])
        out[name] = metric.compute()
    if rank == 0:
        torch.save(out, result)
    dist.destroy_process_group()


@pytest.mark.slow
def test_metrics_synchronise_across_two_gloo_processes() -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        path, result = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(_ddp_worker, args=(path, result), nprocs=2, join=True)
        got = torch.load(result)
    mean, std, y, w = calibrated_draws(b=6, n=20)
    want = {
        "loglik": run(LogLikelihood(), mean, std, y, w),
        "stderr": run(LogLikelihoodStandardError(), mean, std, y, w),
        "crps": run(CRPS(), mean, std, y, w),
        "cover": run(IntervalCoverage(0.5), mean, std, y, w),
    }
    for name, value in want.items():
        assert float(got[name]) == pytest.approx(value, rel=1e-5), name


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_module_weights_evaluation_by_cos_latitude() -> None:
    from gridtnp import NeuralProcessModule
    from gridtnp.batch import Batch, Observations

    with pytest.raises(ConfigError, match="latitude_dim 2"):
        NeuralProcessModule(preset="cnp", dim=8, dim_x=2, cos_latitude_weighting=True, latitude_dim=2)
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=2, cos_latitude_weighting=True, latitude_dim=0)
    x = torch.tensor([[[0.0, 5.0], [60.0, 5.0]]])
    y = torch.tensor([[[1.0], [2.0]]])
    module.forward = lambda batch: Normal(torch.zeros_like(y), torch.ones_like(y))
    module._evaluate(
        Batch({"points": Observations(torch.zeros(1, 1, 2), torch.zeros(1, 1, 1))}, Observations(x, y)), "val"
    )
    assert float(module.metrics["val"]["rmse"].compute()) == pytest.approx(math.sqrt((1.0 + 0.5 * 4.0) / 1.5), rel=1e-5)
    assert float(module.metrics["val"]["mae"].compute()) == pytest.approx((1.0 + 0.5 * 2.0) / 1.5, rel=1e-5)
