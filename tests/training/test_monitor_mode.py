"""The checkpoint keeps the best model by the monitored metric's own ``higher_is_better``, not by its name."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import Tensor
from torchmetrics import Metric

from gridtnp.metrics import monitored_direction
from gridtnp.registry import ConfigError
from gridtnp.training.checkpointing import Checkpoint

#: What the new metric reads at each validation: the best (lowest) is the second epoch's.
SPREADS = [3.0, 1.0, 2.0, 4.0]


class Spread(Metric):
    """A metric named in no list of gridtnp: the mean of the values it is given; lower is better."""

    higher_is_better = False
    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        self.total += values.sum()
        self.count += values.numel()

    def compute(self) -> Tensor:
        return self.total / self.count


class Model(L.LightningModule):
    """One parameter; validation logs ``val/spread`` from ``SPREADS``, one value per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.metrics = torch.nn.ModuleDict({"spread": Spread()})

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return (self.weight - batch).square().mean()

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.metrics["spread"].update(torch.tensor([SPREADS[self.current_epoch]]))
        self.log("val/spread", self.metrics["spread"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(checkpoint: Checkpoint, tmp_path) -> None:
    data = torch.utils.data.DataLoader(torch.ones(2, 1), batch_size=1)
    trainer = L.Trainer(
        max_epochs=len(SPREADS),
        callbacks=[checkpoint],
        logger=False,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Model(), train_dataloaders=data, val_dataloaders=data)


def test_a_new_lower_is_better_metric_keeps_the_lowest_checkpoint(tmp_path):
    checkpoint = Checkpoint(dirpath=tmp_path, monitor="val/spread", save_top_k=1, filename="{epoch}")
    fit(checkpoint, tmp_path)
    assert checkpoint.mode == "min"
    assert float(checkpoint.best_model_score) == min(SPREADS)
    assert checkpoint.best_model_path.endswith(f"epoch={SPREADS.index(min(SPREADS))}.ckpt")


def test_a_mode_against_the_metric_is_refused(tmp_path):
    checkpoint = Checkpoint(dirpath=tmp_path, monitor="val/spread", mode="max", save_top_k=1)
    with pytest.raises(ConfigError, match=r"mode max with --checkpoint.monitor val/spread would keep the worst"):
        fit(checkpoint, tmp_path)


def test_a_metric_without_a_direction_needs_a_mode(tmp_path):
    checkpoint = Checkpoint(dirpath=tmp_path, monitor="val/unknown", save_top_k=1)
    with pytest.raises(ConfigError, match=r"no metric of that name .* set --checkpoint.mode min or max"):
        fit(checkpoint, tmp_path)


def test_gridtnp_metrics_say_their_direction():
    from gridtnp.module import NeuralProcessModule

    module = NeuralProcessModule(preset="cnp", dim=8)
    directions = {name: monitored_direction(module, name) for name in ("val/loglik", "val/heldout/rmse", "test/crps")}
    assert directions == {"val/loglik": True, "val/heldout/rmse": False, "test/crps": False}
    assert monitored_direction(module, "val/crps_physical") is False
    assert monitored_direction(module, "val/coverage_90") is None  # best at 0.9, neither higher nor lower
