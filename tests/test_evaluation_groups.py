"""Evaluation beyond the pooled metrics: mean z^2, the log-likelihood in physical units, metrics of the context and
held-out targets (``extras["is_context"]``), the variance calibration and the printed table."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.distributions import Normal
from torch.utils.data import DataLoader

from gridtnp import NeuralProcessModule
from gridtnp.batch import Batch, BatchError, Observations
from gridtnp.cli.reports import format_metrics
from gridtnp.metrics import MeanSquaredStandardisedError, PhysicalLogLikelihood, evaluation_metrics
from gridtnp.module import observed_targets


def hand_made_batch(seed: int = 0, b: int = 3, n: int = 8) -> Batch:
    """Targets with padding, a target scale, a baseline's errors and which targets were in the context."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(b, n, 1, generator=g), torch.randn(b, n, 1, generator=g)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, -2:] = False
    is_context = torch.rand(b, n, generator=g) < 0.4
    is_context[2] = False  # a task without context targets: left out of the context task means
    extras = {
        "target_scale": torch.tensor([2.0, 3.0, 0.5]),
        "coarse_sq_err": torch.rand(b, n, generator=g),
        "is_context": is_context,
    }
    context = {"points": Observations(torch.randn(b, 4, 1, generator=g), torch.randn(b, 4, 1, generator=g))}
    return Batch(context, Observations(x, y, mask), extras)


def fixed_predictive(batch: Batch) -> Normal:
    """A predictive that depends only on the target locations (the same for every module)."""
    x = batch.target.x
    return Normal(0.3 * x, 0.5 + x.abs())


def loader(batches: list[Batch]) -> DataLoader:
    return DataLoader(batches, batch_size=None, collate_fn=lambda b: b)


def trainer(**kwargs) -> L.Trainer:
    kw = {"logger": False, "enable_progress_bar": False, "enable_checkpointing": False, "enable_model_summary": False}
    return L.Trainer(accelerator="cpu", **kw, **kwargs)


def expected(batches: list[Batch], subset: str | None) -> dict[str, float]:
    """The metrics computed directly on the targets of one subset, each batch's other targets masked out."""
    metrics = evaluation_metrics()
    for batch in batches:
        dist = fixed_predictive(batch)
        keep = batch.target.mask.clone()
        if subset is not None:
            keep &= batch.extras["is_context"] if subset == "context" else ~batch.extras["is_context"]
        w = keep.float()
        scale = batch.extras["target_scale"]
        for name in ("loglik", "loglik_stderr", "rmse", "mae", "crps", "calibration_logdensity", "mean_z2"):
            metrics[name].update(dist.mean, dist.stddev, batch.target.y, w)
        for name in ("coverage_50", "coverage_90"):
            metrics[name].update(dist.mean, dist.stddev, batch.target.y, w)
        for name in ("loglik_physical", "rmse_physical", "mae_physical", "crps_physical"):
            metrics[name].update(dist.mean, dist.stddev, batch.target.y, w, scale)
        metrics["baseline_rmse_physical"].update(batch.extras["coarse_sq_err"] * scale.view(-1, 1) ** 2, w)
    return {name: float(m.compute()) for name, m in metrics.items() if name != "oracle_loglik"}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_context_and_heldout_metrics_match_each_subset_scored_alone() -> None:
    batches = [hand_made_batch(0), hand_made_batch(1)]
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=1)
    module.forward = fixed_predictive
    trainer().test(module, loader(batches), verbose=False)
    logged = {k: float(v) for k, v in trainer_metrics(module).items()}
    for prefix, subset in (("", None), ("context/", "context"), ("heldout/", "heldout")):
        for name, value in expected(batches, subset).items():
            assert logged[f"test/{prefix}{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), prefix + name
    # The split is a partition: the pooled squared error is the weighted sum of the subsets'.
    n_ctx = sum(int((b.extras["is_context"] & b.target.mask).sum()) for b in batches)
    n_all = sum(int(b.target.mask.sum()) for b in batches)
    pooled = (n_ctx * logged["test/context/rmse"] ** 2 + (n_all - n_ctx) * logged["test/heldout/rmse"] ** 2) / n_all
    assert math.sqrt(pooled) == pytest.approx(logged["test/rmse"], rel=1e-5)
    table = format_metrics({k.removeprefix("test/"): v for k, v in logged.items()}, "test")
    header = table.splitlines()[0].split()
    assert header == ["metric", "all", "context", "heldout"]
    row = next(line for line in table.splitlines() if line.startswith("test/rmse "))
    assert row.split()[1:] == [f"{logged[f'test/{p}rmse']:.4f}" for p in ("", "context/", "heldout/")]


def trainer_metrics(module: NeuralProcessModule) -> dict[str, torch.Tensor]:
    return dict(module.trainer.callback_metrics)


def test_extras_must_have_their_declared_shapes() -> None:
    batch = hand_made_batch()
    misaligned = {**batch.extras, "is_context": batch.extras["is_context"][:, :3]}
    with pytest.raises(BatchError, match=r"is_context.*\[B, Nt\] = \[3, 8\]"):
        Batch(batch.context, batch.target, misaligned)
    with pytest.raises(BatchError, match=r"target_scale.*\[B\] = \[3\]"):
        Batch(batch.context, batch.target, {"target_scale": torch.ones(3, 1)})
    with pytest.raises(BatchError, match=r"per-task tensor.*Declared extras"):
        Batch(batch.context, batch.target, {"my_note": torch.ones(2)})
    assert Batch(batch.context, batch.target, {"my_note": torch.ones(3, 5)}).extras["my_note"].shape == (3, 5)


def test_mean_z2_and_loglik_physical_closed_forms() -> None:
    g = torch.Generator().manual_seed(0)
    mean, std = torch.randn(8, 2000, 1, generator=g), 0.2 + torch.rand(8, 2000, 1, generator=g)
    y = mean + std * torch.randn(8, 2000, 1, generator=g)
    w = torch.ones(8, 2000)
    calibrated, narrow = MeanSquaredStandardisedError(), MeanSquaredStandardisedError()
    calibrated.update(mean, std, y, w)
    narrow.update(mean, std / 2, y, w)
    assert float(calibrated.compute()) == pytest.approx(1.0, abs=0.03)
    assert float(narrow.compute()) == pytest.approx(4.0 * float(calibrated.compute()), rel=1e-5)
    # y in kelvin = scale * y: the density of the scaled predictive at the scaled observations.
    scale = torch.linspace(0.5, 4.0, 8)
    physical = PhysicalLogLikelihood()
    physical.update(mean, std, y, w, scale)
    s = scale.view(-1, 1, 1)
    direct = Normal(mean * s, std * s).log_prob(y * s).mean((1, 2)).mean()
    assert float(physical.compute()) == pytest.approx(float(direct), rel=1e-5)


def over_confident(batch: Batch) -> Normal:
    """A predictive whose std is a third of the truth's: the fitted scale must be about 3."""
    return Normal(torch.zeros_like(batch.target.y), torch.full_like(batch.target.y, 1.0 / 3.0))


def noise_batches(count: int, seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        y = torch.randn(4, 50, 1, generator=g)
        context = {"points": Observations(torch.randn(4, 3, 1, generator=g), torch.randn(4, 3, 1, generator=g))}
        out.append(Batch(context, Observations(torch.randn(4, 50, 1, generator=g), y)))
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_variance_calibration_is_fitted_on_validation_saved_and_applied_at_test(tmp_path) -> None:
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=1, variance_calibration=True)
    assert module.num_parameters == NeuralProcessModule(preset="cnp", dim=8, dim_x=1).num_parameters
    module.forward = over_confident
    val, test = noise_batches(4, 0), noise_batches(4, 1)
    t = trainer()
    t.validate(module, loader(val), verbose=False)
    z2 = torch.cat([b.target.y for b in val]).square().mean() * 9.0  # the uncalibrated mean z^2 on validation
    assert float(module.std_scale[0]) == pytest.approx(math.sqrt(float(z2)), rel=1e-5)
    assert float(t.callback_metrics["val/mean_z2"]) == pytest.approx(float(z2), rel=1e-5)  # val: uncalibrated
    t.test(module, loader(val), verbose=False)  # on the validation set itself, calibrated mean z^2 is exactly 1
    assert float(t.callback_metrics["test/mean_z2"]) == pytest.approx(1.0, rel=1e-5)
    assert float(t.callback_metrics["test/uncalibrated/mean_z2"]) == pytest.approx(float(z2), rel=1e-5)
    t.test(module, loader(test), verbose=False)  # unseen data: close to 1, and reported both ways
    assert float(t.callback_metrics["test/mean_z2"]) == pytest.approx(1.0, abs=0.1)
    metrics = {k: float(v) for k, v in t.callback_metrics.items()}
    assert metrics["test/uncalibrated/coverage_90"] < 0.5 < metrics["test/coverage_90"]
    assert float(t.callback_metrics["test/calibration_scale"]) == pytest.approx(float(module.std_scale[0]))
    # The scale travels with the checkpoint; a module without the option drops it, saying so.
    path = tmp_path / "calibrated.ckpt"
    t.save_checkpoint(path)
    restored = NeuralProcessModule.load_from_checkpoint(path)
    assert restored.variance_calibration and bool(restored.std_scale_fitted)
    torch.testing.assert_close(restored.std_scale, module.std_scale)
    checkpoint = torch.load(path, weights_only=True)
    plain = NeuralProcessModule(preset="cnp", dim=8, dim_x=1)
    with pytest.warns(UserWarning, match="variance_calibration true to apply it"):
        plain.on_load_checkpoint(checkpoint)
    plain.load_state_dict(checkpoint["state_dict"])  # strict: the calibration keys were dropped


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_variance_calibration_accepts_a_checkpoint_without_it(tmp_path) -> None:
    plain = NeuralProcessModule(preset="cnp", dim=8, dim_x=1)
    checkpoint = {"state_dict": plain.state_dict()}
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=1, variance_calibration=True)
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    assert not bool(module.std_scale_fitted) and float(module.std_scale[0]) == 1.0


def observed_batches(count: int, seed: int) -> list[Batch]:
    """Noise targets; in every task the first 10 targets sit on its context points, whose values they repeat."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x, y = torch.randn(4, 50, 1, generator=g), torch.randn(4, 50, 1, generator=g)
        context = {"points": Observations(x[:, :10].clone(), y[:, :10].clone())}
        out.append(Batch(context, Observations(x, y)))
    return out


def near_exact_where_observed(batch: Batch) -> Normal:
    """Errors of about 1e-3 at the observed targets and 1 elsewhere, with std 1/3 everywhere."""
    y = batch.target.y
    observed = torch.zeros_like(y, dtype=torch.bool)
    observed[:, :10] = True
    mean = torch.where(observed, y + 1e-3 * torch.sign(y), torch.zeros_like(y))
    return Normal(mean, torch.full_like(y, 1.0 / 3.0))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_targets_on_context_points_get_their_own_calibration_scale(tmp_path) -> None:
    val = observed_batches(3, 0)
    observed = observed_targets(val[0], None)
    assert observed[:, :10].all() and not observed[:, 10:].any()
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=1, variance_calibration=True)
    module.forward = near_exact_where_observed
    t = trainer()
    t.validate(module, loader(val), verbose=False)
    held_out = torch.cat([b.target.y[:, 10:] for b in val]).square().mean() * 9.0
    assert float(module.std_scale[0]) == pytest.approx(math.sqrt(float(held_out)), rel=1e-5)
    assert float(module.std_scale_observed[0]) == pytest.approx(3e-3, rel=1e-5)  # error 1e-3 over std 1/3
    t.test(module, loader(val), verbose=False)
    assert float(t.callback_metrics["test/mean_z2"]) == pytest.approx(1.0, rel=1e-4)  # both groups at 1
    # Old checkpoints (one scale) load with that scale for every target.
    path = tmp_path / "model.ckpt"
    t.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"].pop("std_scale_observed")
    restored = NeuralProcessModule(preset="cnp", dim=8, dim_x=1, variance_calibration=True)
    restored.on_load_checkpoint(checkpoint)
    restored.load_state_dict(checkpoint["state_dict"])
    torch.testing.assert_close(restored.std_scale_observed, module.std_scale)
