"""bf16 mixed precision: the network may run in bf16, the likelihood's variance and log-density stay in float32."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.nn.likelihoods import GaussianLikelihood, HomoscedasticLikelihood, log_likelihood
from gridtnp.registry import build_from_spec


@pytest.mark.parametrize("likelihood", [GaussianLikelihood, HomoscedasticLikelihood])
def test_likelihood_is_float32_under_bf16_autocast(likelihood):
    head = likelihood(dim=16, dim_y=2)
    z, y = torch.randn(3, 5, 16), torch.randn(3, 5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head.head(z).dtype == torch.bfloat16  # the MLP really runs in bf16
        dist = head(z)
        loglik = log_likelihood(dist, y, mask)
    assert dist.mean.dtype == dist.variance.dtype == loglik.dtype == torch.float32
    # The density is the float32 (here float64) Gaussian of the float32 mean and variance: no bf16 rounding.
    exact = torch.distributions.Normal(dist.mean.double(), dist.stddev.double()).log_prob(y.double()).sum(-1).mean(-1)
    torch.testing.assert_close(loglik.double(), exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("preset", ["tnp", "convcnp"])
def test_models_under_bf16_autocast_match_float32(preset):
    task = build_from_spec("task", {"name": "gp1d"})
    batch = task.sample(4, torch.Generator().manual_seed(0))
    module = NeuralProcessModule(preset=preset, dim=32).eval()
    with torch.no_grad():
        reference = log_likelihood(module(batch), batch.target.y, batch.target.valid())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dist = module(batch)
            loglik = log_likelihood(dist, batch.target.y, batch.target.valid())
    assert loglik.dtype == dist.mean.dtype == torch.float32
    torch.testing.assert_close(loglik, reference, rtol=0.05, atol=0.05)  # bf16 has an 8-bit mantissa


def test_bf16_mixed_training_on_cpu(tmp_path):
    L.seed_everything(0)
    data = from_flat_arguments(SyntheticDataModule, task={"name": "gp1d"}, batch_size=8, train_batches=4, val_batches=2)
    module = NeuralProcessModule(preset="tnp", dim=32, processor={"layers": 2})
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and torch.isfinite(metrics["val/loglik"])
    assert all(p.dtype == torch.float32 for p in module.parameters())  # mixed: weights stay float32
