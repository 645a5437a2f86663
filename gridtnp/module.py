"""``NeuralProcessModule``: the LightningModule that trains and evaluates any five-slot neural process."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor
from torchmetrics import MeanMetric, MeanSquaredError

from gridtnp.data.batch import Batch
from gridtnp.models.neural_process import build_model, count_parameters
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.scaling import report_training_scale

Spec = dict[str, Any]


class RootMeanMetric(MeanMetric):
    """Square root of a (weighted) mean, e.g. an RMSE from squared errors; synchronised across ranks like the mean."""

    def compute(self) -> Tensor:
        return super().compute().sqrt()


class NeuralProcessModule(L.LightningModule):
    """Trains a neural process by maximising the mean log-likelihood per target point.

    Evaluation logs ``loglik`` and ``rmse`` (normalised units); with ``extras["target_scale"]`` ``[B]`` also
    ``rmse_physical`` (errors times the scale), and with ``extras["coarse_sq_err"]`` (a baseline's per-task mean
    squared normalised error, weighted by ``extras["num_targets"]``) ``baseline_rmse_physical``.

    The model arguments are the five slots of ``gridtnp.models.build_model`` (each a mapping with a
    registered ``name``), the shared sizes, or a ``preset`` name whose slots they override.

    Args:
        encoder: point-wise encoder, e.g. ``{name: mlp}``; or ``{source: spec}`` per context source.
        grid_encoder: e.g. ``{name: identity}`` (grid-free) or ``{name: kernel_interpolation}``.
        processor: e.g. ``{name: transformer, layers: 5}``.
        grid_decoder: e.g. ``{name: cross_attention}``.
        likelihood: e.g. ``{name: gaussian}``.
        preset: a registered model preset (``gridtnp list model``) the slots above override.
        dim: token width D_z.
        dim_x: input dimension Dx.
        dim_y: output dimension Dy, or ``{source: Dy}`` for several context sources.
        target_source: the source whose encoder embeds target locations (needed with several sources).
        target_dim_y: Dy of the targets when it differs from the target source's.
        grid: the model's grid ``{lower: [...], upper: [...], shape: [...], roll: [...]}`` for gridded models.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up from 0 over this many steps.
    """

    def __init__(
        self,
        encoder: Spec | None = None,
        grid_encoder: Spec | None = None,
        processor: Spec | None = None,
        grid_decoder: Spec | None = None,
        likelihood: Spec | None = None,
        preset: str | None = None,
        dim: int | None = None,
        dim_x: int | None = None,
        dim_y: int | dict[str, int] | None = None,
        target_source: str | None = None,
        target_dim_y: int | None = None,
        grid: dict[str, Any] | None = None,
        lr: float = 5e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        spec = {
            "preset": preset,
            "encoder": encoder,
            "grid_encoder": grid_encoder,
            "processor": processor,
            "grid_decoder": grid_decoder,
            "likelihood": likelihood,
            "dim": dim,
            "dim_x": dim_x,
            "dim_y": dim_y,
            "target_source": target_source,
            "target_dim_y": target_dim_y,
            "grid": grid,
        }
        self.model = build_model(spec)
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.metrics = torch.nn.ModuleDict(
            {
                stage: torch.nn.ModuleDict(
                    {
                        "loglik": MeanMetric(),
                        "rmse": MeanSquaredError(squared=False),
                        "oracle_loglik": MeanMetric(),
                        "rmse_physical": RootMeanMetric(),
                        "baseline_rmse_physical": RootMeanMetric(),
                    }
                )
                for stage in ("val", "test")
            }
        )

    @property
    def num_parameters(self) -> int:
        return count_parameters(self.model)

    def forward(self, batch: Batch) -> torch.distributions.Distribution:
        """Predictive distribution ``[B, Nt, Dy]`` at the batch's target locations."""
        return self.model(batch.context, batch.target.x)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, Batch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def _loglik(self, batch: Batch) -> tuple[torch.distributions.Distribution, Tensor, Tensor]:
        dist = self(batch)
        valid = batch.target.valid()
        return dist, log_likelihood(dist, batch.target.y, valid), valid

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        _, loglik, _ = self._loglik(batch)
        loss = -loglik.mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.batch_size)
        return loss

    def _evaluate(self, batch: Batch, stage: str) -> None:
        dist, loglik, valid = self._loglik(batch)
        metrics = self.metrics[stage]
        metrics["loglik"].update(loglik)
        metrics["rmse"].update(dist.mean[valid], batch.target.y[valid].float())
        logs = {f"{stage}/loglik": metrics["loglik"], f"{stage}/rmse": metrics["rmse"]}
        if "oracle_loglik" in batch.extras:
            metrics["oracle_loglik"].update(batch.extras["oracle_loglik"])
            logs[f"{stage}/oracle_loglik"] = metrics["oracle_loglik"]
        if "target_scale" in batch.extras:
            # Physical units: normalised errors times the task's scale, pooled over target points like `rmse`.
            scale = batch.extras["target_scale"].float()
            err = dist.mean[valid].float() - batch.target.y[valid].float()  # [P, Dy]
            point_scale = scale.view(-1, 1).expand(valid.shape)[valid]  # [P]
            metrics["rmse_physical"].update(err.square() * point_scale.square().unsqueeze(-1))
            logs[f"{stage}/rmse_physical"] = metrics["rmse_physical"]
            if "coarse_sq_err" in batch.extras:
                weight = batch.extras.get("num_targets", torch.ones_like(scale)).float()
                metrics["baseline_rmse_physical"].update(batch.extras["coarse_sq_err"].float() * scale.square(), weight)
                logs[f"{stage}/baseline_rmse_physical"] = metrics["baseline_rmse_physical"]
        self.log_dict(logs, prog_bar=stage == "val", batch_size=batch.batch_size)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        dist = self(batch)
        return {"mean": dist.mean, "std": dist.stddev, "mask": batch.target.mask}

    def on_fit_start(self) -> None:
        report_training_scale(self.trainer, self.lr)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.warmup_steps <= 0:
            return optimizer
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / self.warmup_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}
