"""The joint (low-rank) likelihood, the sample-based joint scores, and joint samples in predictions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from torch.distributions import MultivariateNormal, Normal

from gridtnp import NeuralProcessModule
from gridtnp.calibration import VarianceCalibration
from gridtnp.data.datamodules import SyntheticDataModule
from gridtnp.data.sections import LoaderConfig
from gridtnp.inference.predictions import PredictionWriter, predict
from gridtnp.joint_metrics import JointScores, energy_score, regional_mean, variogram_score
from gridtnp.nn.likelihoods import LowRankGaussianLikelihood, log_likelihood
from gridtnp.nn.lowrank_normal import LowRankNormal, concatenate, draw_samples
from gridtnp.nn.residuals import shift_mean
from gridtnp.registry import ConfigError
from tests.trainers import quiet_trainer

MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)


def lowrank(dim_y: int = 2, rank: int = 3) -> LowRankNormal:
    torch.manual_seed(0)
    return LowRankGaussianLikelihood(dim=8, dim_y=dim_y, rank=rank)(torch.randn(3, 5, 8))


def dense(dist: LowRankNormal, b: int, keep: torch.Tensor) -> MultivariateNormal:
    """The dense MultivariateNormal of task ``b``'s targets ``keep``, in float64."""
    loc = dist.loc[b][keep].reshape(-1).double()
    w = dist.factor[b][keep].reshape(loc.shape[0], -1).double()
    return MultivariateNormal(loc, w @ w.T + torch.diag(dist.diag[b][keep].reshape(-1).double()))


def test_joint_log_density_equals_a_dense_multivariate_normal_on_a_masked_batch() -> None:
    dist = lowrank()
    y = torch.randn(3, 5, 2)
    y[1, 2] = float("nan")  # a padded target's value never reaches the density
    logp = dist.joint_log_prob(y, MASK).detach()
    for b in range(3):
        with torch.no_grad():
            expected = dense(dist, b, MASK[b]).log_prob(y[b][MASK[b]].reshape(-1).double())
        assert float(logp[b]) == pytest.approx(float(expected), rel=1e-5)
    per_point = log_likelihood(dist, y, MASK)
    assert torch.allclose(per_point, logp / MASK.sum(-1), rtol=1e-6)
    assert torch.isfinite(torch.autograd.grad(per_point.sum(), dist.factor)[0]).all()


def test_the_marginal_mean_gradient_keeps_the_joint_value_and_fits_the_mean_by_the_marginals() -> None:
    dist = lowrank(dim_y=1)
    y = torch.randn(3, 5, 1)
    split = LowRankNormal(dist.loc, dist.factor, dist.diag, "marginal")
    value = split.objective(y, MASK)
    assert torch.allclose(value, dist.joint_log_prob(y, MASK))
    loc_grad, factor_grad = torch.autograd.grad(value.sum(), [dist.loc, dist.factor])
    residual = torch.where(MASK.unsqueeze(-1), (y - dist.loc) / dist.stddev.square(), 0.0)
    assert torch.allclose(loc_grad, residual.detach(), atol=1e-5)  # d/dmean of the marginals, std held fixed
    fixed = LowRankNormal(dist.loc.detach(), dist.factor, dist.diag).joint_log_prob(y, MASK)
    assert torch.allclose(factor_grad, torch.autograd.grad(fixed.sum(), dist.factor)[0], atol=1e-6)


def test_the_marginals_gradient_fits_mean_and_scales_by_the_marginals_and_correlations_by_the_joint() -> None:
    dist = lowrank(dim_y=1)
    loc, factor, diag = dist.loc.detach(), dist.factor.detach(), dist.diag.detach()
    y = torch.randn(3, 5, 1)
    stretch = torch.zeros(3, 5, 1, requires_grad=True)  # multiplies one component's deviation: its scale alone

    def stretched(how: str) -> torch.Tensor:
        grow = 1 + stretch
        return LowRankNormal(loc, factor * grow.unsqueeze(-1), diag * grow.square(), how).objective(y, MASK)

    loc.requires_grad_()
    value = stretched("marginals")
    assert torch.allclose(value, dist.joint_log_prob(y, MASK))
    loc_grad, stretch_grad = torch.autograd.grad(value.sum(), [loc, stretch])
    z2 = ((y - loc) / dist.stddev).square().detach()
    valid = MASK.unsqueeze(-1)
    assert torch.allclose(loc_grad, torch.where(valid, (y - loc) / dist.stddev.square(), 0.0).detach(), atol=1e-5)
    assert torch.allclose(stretch_grad, torch.where(valid, z2 - 1, 0.0), atol=1e-5)  # d/dlog s of the marginals
    scale_by_joint = torch.autograd.grad(stretched("marginal").sum(), stretch)[0]
    assert not torch.allclose(scale_by_joint, stretch_grad, atol=1e-3)
    # along a change of the factor that keeps every marginal variance, the gradient is the joint density's
    delta = torch.zeros_like(factor, requires_grad=True)
    moved = factor + delta
    kept = diag + factor.square().sum(-1) - moved.square().sum(-1)
    split = LowRankNormal(loc, moved, kept, "marginals").objective(y, MASK)
    joint = LowRankNormal(loc, moved, kept).joint_log_prob(y, MASK)
    got = torch.autograd.grad(split.sum(), delta, retain_graph=True)[0]  # the two share the graph of ``kept``
    expected = torch.autograd.grad(joint.sum(), delta)[0]
    assert torch.allclose(got, expected, atol=1e-5) and float(expected.abs().max()) > 1e-3


def test_a_rank_zero_factor_gives_the_independent_gaussian() -> None:
    loc, var = torch.randn(2, 4, 1), torch.rand(2, 4, 1) + 0.1
    joint = LowRankNormal(loc, torch.zeros(2, 4, 1, 2), var)
    y, mask = torch.randn(2, 4, 1), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    independent = log_likelihood(Normal(loc, var.sqrt()), y, mask)
    assert torch.allclose(log_likelihood(joint, y, mask), independent, atol=1e-5)


def test_marginals_rescaling_chunks_and_samples_keep_the_joint() -> None:
    dist = lowrank(dim_y=1)
    cov = dist.covariance()
    assert torch.allclose(dist.stddev.reshape(3, -1), cov.diagonal(dim1=-2, dim2=-1).sqrt(), atol=1e-6)
    scale = torch.rand(3, 5, 1) + 0.5
    shifted = shift_mean(dist, torch.ones(3, 5, 1), scale)  # the residual's mean shift and spread
    assert isinstance(shifted, LowRankNormal)
    s = scale.reshape(3, -1)
    assert torch.allclose(shifted.covariance(), cov * s.unsqueeze(-1) * s.unsqueeze(-2), atol=1e-6)
    assert torch.allclose(shifted.mean, dist.mean + 1)
    joined = concatenate([LowRankNormal(dist.loc[:, :2], dist.factor[:, :2], dist.diag[:, :2]),
                          LowRankNormal(dist.loc[:, 2:], dist.factor[:, 2:], dist.diag[:, 2:])])  # fmt: skip
    assert torch.equal(joined.covariance(), cov)
    draws = draw_samples(dist, 40_000, torch.Generator().manual_seed(0))
    assert draws.shape == (40_000, 3, 5, 1)
    empirical = torch.cov(draws[:, 0, :, 0].T)
    assert torch.allclose(empirical, cov[0], atol=0.05 * float(cov[0].diagonal().max().detach()))


def test_the_variance_calibration_scales_the_joint_covariance() -> None:
    class Calibrated(VarianceCalibration, torch.nn.Module):
        pass

    module = Calibrated()
    module.init_calibration(True, 1)
    module.std_scale.fill_(2.0)
    dist = lowrank(dim_y=1)
    calibrated = module.calibrate(dist)
    assert isinstance(calibrated, LowRankNormal)
    assert torch.allclose(calibrated.covariance(), 4 * dist.covariance(), atol=1e-6)


def test_kriging_with_a_joint_likelihood_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="kriging is per target"):
        NeuralProcessModule(
            dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=8, encoder={"name": "mlp"},
            grid_encoder={"name": "identity"}, processor={"name": "transformer", "layers": 1},
            grid_decoder={"name": "cross_attention"}, likelihood={"name": "lowrank_gaussian", "rank": 2},
            kriging={"name": "gp", "source": "stations", "grid": {"lower": [0, 0], "upper": [1, 1], "shape": [4, 4]}},
        )  # fmt: skip


def test_energy_score_of_a_sample_set_equals_the_hand_computation() -> None:
    samples = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]).view(3, 1, 2, 1)  # M = 3 samples of K = 2
    y = torch.tensor([[[0.0], [1.0]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    to_obs = (1.0 + math.sqrt(9 + 9) + 0.0) / 3
    spread = 2 * (5.0 + 1.0 + math.sqrt(9 + 9)) / (2 * 3 * 2)
    assert float(energy_score(samples, y, valid)[0]) == pytest.approx(to_obs - spread, abs=1e-6)
    # A padded third target with any value changes nothing.
    padded = torch.cat([samples, torch.full((3, 1, 1, 1), 7.0)], 2)
    mask = torch.tensor([[True, True, False]])
    assert float(energy_score(padded, torch.cat([y, torch.zeros(1, 1, 1)], 1), mask)[0]) == pytest.approx(
        to_obs - spread, abs=1e-6
    )
    # Variogram of order 1/2 over the two ordered pairs: (|0 - 1|^.5 - mean(0, 1, 1))^2 = (1 - 2/3)^2.
    assert float(variogram_score(samples, y, valid)[0]) == pytest.approx((1 - 2 / 3) ** 2, rel=1e-6)


def test_regional_mean_variance_is_the_weighted_dense_covariance() -> None:
    dist = lowrank(dim_y=1)
    weight = torch.rand(3, 5) * MASK
    y = torch.randn(3, 5, 1)
    with torch.no_grad():  # values only: no scalar taken from a tensor that requires grad
        mean, std, observed = regional_mean(dist, y, weight)
        covariance, loc = dist.covariance().double(), dist.loc.double()
    for b in range(3):
        w = (weight[b] / weight[b].sum()).double()
        cov = covariance[b]
        assert float(std[b, 0]) ** 2 == pytest.approx(float(w @ cov @ w), rel=1e-5)
        assert float(mean[b, 0]) == pytest.approx(float(w @ loc[b, :, 0]), rel=1e-5)
        assert float(observed[b, 0]) == pytest.approx(float(w @ y[b, :, 0].double()), rel=1e-5)
    _, independent_std, _ = regional_mean(Normal(dist.loc, dist.stddev), y, weight)
    assert not torch.allclose(independent_std, std)  # the correlations count


def test_correlated_truth_scores_better_under_the_joint_than_the_independent_predictive() -> None:
    """Draws of a strongly correlated Gaussian: the joint predictive's energy and variogram scores beat those of
    the independent Gaussian with the same marginals, and its regional-mean intervals cover 90 %."""
    torch.manual_seed(1)
    n, b = 20, 400
    factor = torch.ones(b, n, 1, 1)
    joint = LowRankNormal(torch.zeros(b, n, 1), factor, torch.full((b, n, 1), 0.1))
    y = draw_samples(joint, 1, torch.Generator().manual_seed(5))[0]
    weight = torch.ones(b, n)
    scorer = JointScores(samples=64)
    joint_scores = scorer.scores(joint, y, weight)
    independent = scorer.scores(Normal(joint.loc, joint.stddev), y, weight)
    assert joint_scores["energy_score"].mean() < independent["energy_score"].mean()
    assert joint_scores["variogram_score"].mean() < independent["variogram_score"].mean()
    assert joint_scores["joint_loglik"].mean() > independent["joint_loglik"].mean()
    assert 0.85 < float(joint_scores["regional_mean_coverage_90"].mean()) < 0.95
    assert float(independent["regional_mean_coverage_90"].mean()) < 0.5  # far too narrow for the region


def small_gp_module(likelihood: dict) -> tuple[NeuralProcessModule, SyntheticDataModule]:
    module = NeuralProcessModule(
        dim_x=2, dim_y=1, dim=16, encoder={"name": "mlp"}, grid_encoder={"name": "identity"},
        processor={"name": "transformer", "layers": 1}, grid_decoder={"name": "cross_attention", "layers": 1},
        likelihood=likelihood, score_samples=8,
    )  # fmt: skip
    task = {"name": "gp2d", "num_context": 30, "num_targets": 12, "domain": [-2.0, 2.0], "lengthscale": 1.0}
    data = SyntheticDataModule(task, LoaderConfig(batch_size=4, train_batches=2, val_batches=1, test_batches=2))
    return module, data


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["gaussian", "lowrank_gaussian"])
def test_test_logs_the_joint_scores_and_predict_writes_joint_samples(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module, data = small_gp_module({"name": name})
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    logged = trainer.test(module, datamodule=data, verbose=False)[0]
    for key in ("energy_score", "variogram_score", "joint_loglik", "regional_mean_coverage_90", "crps"):
        assert math.isfinite(logged[f"test/{key}"]), key
    assert logged["test/energy_score"] > 0 and 0 <= logged["test/regional_mean_coverage_90"] <= 1
    if name == "gaussian":  # the joint log-density of independent targets is the mean marginal one
        assert logged["test/joint_loglik"] == pytest.approx(logged["test/loglik"], rel=1e-4)
    out = tmp_path / "pred.nc"
    writer = PredictionWriter(str(out), samples=5)
    quiet_trainer(callbacks=[writer]).predict(module, dataloaders=data.test_dataloader(), return_predictions=False)
    with xr.open_dataset(out) as ds:
        assert ds["mean_sample"].dims == ("task", "point", "output", "sample")
        assert ds["mean_sample"].shape == (8, 12, 1, 5) and ds["sample"].attrs["standard_name"] == "realization"
        assert np.isfinite(ds["mean_sample"].values).all()
        assert not np.allclose(ds["mean_sample"].values[..., 0], ds["mean_sample"].values[..., 1])


@pytest.mark.filterwarnings("ignore:predict. the gridded context:UserWarning")  # a small box on purpose
def test_the_python_predict_api_writes_joint_samples_in_physical_units() -> None:
    torch.manual_seed(0)
    module = NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=16, encoder={"name": "mlp"},
        grid_encoder={"name": "identity"}, processor={"name": "transformer", "layers": 1},
        grid_decoder={"name": "cross_attention"}, likelihood={"name": "lowrank_gaussian", "rank": 4},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    time = np.array(["2019-03-01", "2019-03-02"])
    grid = xr.DataArray(
        280 + rng.standard_normal((2, 3, 4)), dims=("time", "latitude", "longitude"),
        coords={"time": time, "latitude": [50.0, 51.0, 52.0], "longitude": [-2.0, -1.0, 0.0, 1.0]},
    )  # fmt: skip
    stations = xr.DataArray(
        280 + rng.standard_normal((2, 5)), dims=("time", "station"),
        coords={"time": time, "latitude": ("station", rng.uniform(50, 52, 5)),
                "longitude": ("station", rng.uniform(-2, 1, 5))},
    )  # fmt: skip
    stats = {"grid": (280.0, 2.0), "stations": (280.0, 2.0)}
    out = predict(module, {"grid": grid, "stations": stations}, stations.isel(time=0, drop=True), stats=stats,
                  target_stats=(280.0, 2.0), batch_dim="time", samples=200)  # fmt: skip
    assert out["mean_sample"].dims == (*out["mean"].dims, "sample") and out.sizes["sample"] == 200
    draws = out["mean_sample"].values  # kelvin: the mean's units, its spread the predictive's
    np.testing.assert_allclose(draws.mean(-1), out["mean"].values, atol=0.5 * float(out["std"].max()))
    np.testing.assert_allclose(draws.std(-1), out["std"].values, rtol=0.25)
