"""``NeuralProcessModule``: the LightningModule that trains and evaluates any five-slot neural process."""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from gridtnp.batch import Batch
from gridtnp.calibration import VarianceCalibration, observed_targets
from gridtnp.data.contract import optional
from gridtnp.joint_metrics import JointScores
from gridtnp.lead_metrics import add_lead_groups, lead_subsets
from gridtnp.metrics import COVERAGE_METRICS, PHYSICAL_METRICS, PREDICTIVE_METRICS, evaluation_metrics, point_weights
from gridtnp.models.neural_process import TARGET_CHUNK, count_parameters, gaussian
from gridtnp.models.specs import build_model, expand_spec
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.nn.lowrank_normal import draw_samples
from gridtnp.registry import ConfigError
from gridtnp.training.compiling import CompiledModel
from gridtnp.training.lr_scaling import LrScaling, effective_batch
from gridtnp.training.run_scale import report_training_scale
from gridtnp.training.schedules import adamw_with_schedule, budget_seconds, restore_recipe_lr, time_budget

Spec = dict[str, Any]
#: Checkpoint entry with the training data's description (``StoreDataModule.variable_metadata``).
DATA_KEY = "gridtnp_data"


class NeuralProcessModule(VarianceCalibration, L.LightningModule):
    """Trains a neural process by maximising the mean log-likelihood per target point.

    Validation and test log, under ``val/`` and ``test/`` (``gridtnp.metrics``; normalised units unless named
    ``*_physical``): ``loglik`` (mean over tasks of the mean log-density per target point) and ``loglik_stderr``
    (its standard error over tasks), ``rmse``, ``mae``, ``crps`` (Gaussian, closed form),
    ``calibration_logdensity`` (mean log N(z; 0, 1) of the standardised errors, -1.419 when calibrated),
    ``coverage_50`` and ``coverage_90`` (share of targets in the central 50 % / 90 % predictive intervals).
    With ``extras["target_scale"]`` ``[B]``: ``rmse_physical``, ``mae_physical``, ``crps_physical`` (normalised
    values times the scale); with ``extras["coarse_sq_err"]`` ``[B, Nt]`` (a baseline's squared normalised error
    per target, pooled with the same point weights as the model's) ``baseline_rmse_physical``; with
    ``extras["oracle_loglik"]`` ``[B]`` ``oracle_loglik``. Point metrics pool all target points of all tasks;
    ``cos_latitude_weighting`` weights each point (also in ``loglik`` and the baseline, not in the training loss)
    by the cosine of its latitude ``x[..., latitude_dim]``. Also ``mean_z2`` (mean squared standardised error, 1
    when calibrated) and, with ``target_scale``, ``loglik_physical`` (nats per target with ``y`` in physical units).

    Context and held-out targets: a batch with ``extras["is_context"]`` ``[B, Nt]`` (True: that target was also in
    the context) logs every metric also as ``{stage}/context/{name}`` and ``{stage}/heldout/{name}`` (the point
    weights masked to each subset; tasks without such targets are left out of the task means). The DataModule must
    give it in every batch of an evaluation set or in none (under DDP every rank logs the same names).

    Variance calibration (``variance_calibration: true``): ``gridtnp.calibration.VarianceCalibration``. Test also
    logs the scores of the joint predictive over each task's targets (``gridtnp.joint_metrics.JOINT_METRICS``).

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
        residual: ``{name: interpolation, sources: [...], k: 4}``: predict the departure from a kernel-weighted mean of
            the nearest context values of those sources (``gridtnp.nn.residuals``; also ``weight``, ``adaptive``,
            ``departures``, ``spread``, ``regression``); null (default) predicts y itself.
        time_dims: the first ``time_dims`` input dims are times (forecasts: hours from the initial hour), embedded by
            the encoders and left out of the grid encoder, grid decoder and residual; 0 (default): none.
        kriging: ``{name: gp, source: stations, grid: {...}}``: condition the predictive on that source's departures
            from it by a closed-form GP layer with a learned correlation (``gridtnp.nn.kriging``); null (default)
            leaves it as the network gives it.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up from 0 over this many steps.
        lr_scaling: ``{rule: linear | sqrt | none, base_batch: 8}``: scale lr with the effective batch (tasks per
            optimiser step at any world size) from the one it was tuned at (``gridtnp.training.lr_scaling``).
        lr_schedule: after the warm-up, ``"constant"``, or ``"cosine"`` decay to 0 at the end of the run
            (``trainer.max_steps``, or ``trainer.max_time`` when that stops the run first; see
            ``gridtnp.training.schedules``):
            steadier short runs.
        cos_latitude_weighting: weight evaluation metrics by cos(latitude) (targets with latitude in degrees).
        latitude_dim: the column of the target ``x`` that holds the latitude (used with ``cos_latitude_weighting``).
        variance_calibration: fit a post-hoc scale of the predictive std per output on the validation set and
            apply it at test and predict time (see above); off by default.
        compile: run the model through ``torch.compile`` (CPU needs a C compiler); where compiling fails, one
            warning names the reason and the model runs eagerly (``gridtnp.training.compiling.CompiledModel``).
        score_samples: samples per task of the test-time joint scores (``gridtnp.joint_metrics``: energy and
            variogram scores; the regional mean's coverage is exact).
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
        residual: dict[str, Any] | None = None,
        kriging: dict[str, Any] | None = None,
        time_dims: int = 0,
        lr: float = 5e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
        lr_scaling: dict[str, Any] | None = None,
        cos_latitude_weighting: bool = False,
        latitude_dim: int = 0,
        variance_calibration: bool = False,
        compile: bool = False,
        score_samples: int = 32,
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
            "residual": residual,
            "kriging": kriging,
            "time_dims": time_dims or None,
        }
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"model lr must be a finite number > 0; got {lr}.")
        for name, value in (("weight_decay", weight_decay), ("warmup_steps", warmup_steps)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"model {name} must be a finite number >= 0; got {value}.")
        self.model = build_model(spec)
        # Not a submodule (CompiledModel is a plain object): the state dict keeps one copy of the parameters.
        self.compiled = CompiledModel(self.model) if compile else None
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        if lr_schedule not in ("constant", "cosine"):
            raise ConfigError(f"lr_schedule must be 'constant' or 'cosine'; got {lr_schedule!r}.")
        self.lr_schedule, self.lr_scaling = lr_schedule, LrScaling.of(lr_scaling)
        dim_x_model = self.model.dim_x
        if cos_latitude_weighting and not -dim_x_model <= latitude_dim < dim_x_model:
            raise ConfigError(
                f"cos_latitude_weighting: latitude_dim {latitude_dim} is not a column of the model's "
                f"{dim_x_model}-dimensional inputs; give the index of the latitude (in degrees)."
            )
        self.latitude_dim = latitude_dim if cos_latitude_weighting else None
        self.metrics = torch.nn.ModuleDict({s: torch.nn.ModuleDict(evaluation_metrics()) for s in ("val", "test")})
        groups = [f"{stage}_{subset}" for stage in ("val", "test") for subset in ("context", "heldout")]
        if variance_calibration:
            groups += ["test_uncalibrated", "test_uncalibrated_context", "test_uncalibrated_heldout"]
        # Metrics of subsets of the targets, by "<stage>_<group>" (logged as "<stage>/<group with />/<name>").
        self.group_metrics = torch.nn.ModuleDict({g: torch.nn.ModuleDict(evaluation_metrics()) for g in groups})
        dim_y_target = int(expand_spec(spec)["target_dim_y"]) if variance_calibration else 0
        self.init_calibration(variance_calibration, dim_y_target)
        self.joint_scores = JointScores(score_samples)  # test only: samples cost time
        self.predict_samples = 0  # joint samples per task in predict_step's outputs (set by PredictionWriter)
        #: What the checkpoint keeps of the training data (``StoreDataModule.variable_metadata``), or None.
        self.data_metadata: dict[str, Any] | None = None

    def setup(self, stage: str) -> None:
        """Check that the DataModule's tasks have the inputs and sources the model was built for."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        dim_x, dim_y = optional(datamodule, "dim_x"), optional(datamodule, "dim_y")
        name = type(datamodule).__name__
        if isinstance(dim_x, int) and dim_x != self.model.dim_x:
            raise ConfigError(
                f"the model takes {self.model.dim_x}-dimensional inputs (dim_x) but {name}'s tasks have {dim_x}: "
                f"set --model.init_args.dim_x {dim_x}, or use a recipe made for this data."
            )
        if isinstance(dim_y, dict):
            model_sources = {s: e.dim_y for s, e in self.model.encoders.items()}
            if set(dim_y) - set(model_sources) or any(model_sources.get(s) != d for s, d in dim_y.items()):
                raise ConfigError(
                    f"{name}'s context sources {dim_y} (name: Dy) do not match the model's {model_sources}: set the "
                    "model's dim_y to the data's mapping, or use a recipe made for this data."
                )
        self.lead_hours = optional(datamodule, "lead_hours")  # forecast tasks: metrics per lead hour
        add_lead_groups(self.group_metrics, self.lead_hours)
        box = optional(datamodule, "target_box")
        for part in self.model.modules() if box is not None else ():
            if hasattr(part, "check_box"):  # a table of places (the mos decoders) must cover the targets
                part.check_box(box, name)

    @property
    def run_lr(self) -> float:
        """This run's learning rate: ``lr``, scaled with the effective batch by ``lr_scaling``."""
        if self._trainer is None:
            return self.lr
        batch = optional(self._trainer.datamodule, "batch_size")
        return self.lr_scaling.lr(self.lr, effective_batch(self._trainer, batch))

    @property
    def num_parameters(self) -> int:
        return count_parameters(self.model)

    def forward(self, batch: Batch) -> torch.distributions.Distribution:
        """Predictive distribution ``[B, Nt, Dy]`` at the batch's target locations."""
        run = self.compiled if self.compiled is not None else self.model
        return run(batch.context, batch.target.x)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, Batch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def _loglik(self, batch: Batch) -> tuple[torch.distributions.Distribution, Tensor, Tensor]:
        dist = self(batch)
        valid = batch.target.valid()
        return dist, log_likelihood(dist, batch.target.y, valid), valid

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        try:
            _, loglik, _ = self._loglik(batch)
        except ValueError as err:
            if "Expected parameter" not in str(err):  # torch.distributions' check of non-finite parameters
                raise
            raise self._diverged("NaN", "the model's outputs are NaN") from None
        loss = -loglik.mean()
        if not bool(torch.isfinite(loss.detach())):
            value = float(loss.detach())
            raise self._diverged("NaN" if value != value else str(value), "the log-likelihood is not finite")
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.batch_size)
        if self._trainer is not None and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=batch.batch_size)
        return loss

    def _diverged(self, value: str, what: str) -> ConfigError:
        """The error that stops a run whose loss is no longer finite, naming the step (the checkpoints written so
        far are kept: the last one holds the last good state)."""
        step = self.trainer.global_step if self._trainer is not None else 0
        return ConfigError(
            f"loss is {value} at step {step}: {what} (training diverged; learning rate {self.run_lr:g}). Checkpoints "
            "written before are kept; lower --model.init_args.lr (or add warmup_steps) and start again."
        )

    @property
    def target_source(self) -> str | None:
        """The context source the targets belong to (None: the model names none)."""
        return getattr(self.model, "target_source", None)

    def _evaluate(self, batch: Batch, stage: str) -> None:
        dist = gaussian(self(batch), "evaluation metrics")
        target = batch.target
        weight = point_weights(target.valid(), target.x, self.latitude_dim)  # [B, Nt]
        mean, std = dist.mean, dist.stddev
        subsets = {"": weight}
        is_context = batch.extras.get("is_context")  # [B, Nt], checked by Batch
        if is_context is not None:
            subsets["context/"] = weight * is_context
            subsets["heldout/"] = weight * ~is_context.bool()
        subsets.update(lead_subsets(batch, weight, getattr(self, "lead_hours", None)))  # lead_<h>h/: forecast tasks
        if stage == "val" and self.variance_calibration:
            observed = observed_targets(batch, self.target_source)
            self.calibration_sums.update(mean, std, target.y, weight * ~observed)
            self.calibration_sums_observed.update(mean, std, target.y, weight * observed)
        calibrated = stage == "test" and self.variance_calibration
        calibrated_dist = self.calibrate(dist, batch) if calibrated else dist
        for prefix, w in subsets.items():
            if calibrated:
                self._log_metrics(batch, stage, prefix, mean, calibrated_dist.stddev, w)
                prefix = "uncalibrated/" + prefix
            self._log_metrics(batch, stage, prefix, mean, std, w)
        if stage == "test":
            self.joint_scores.update_and_log(self, stage, calibrated_dist, target.y, weight)
        if calibrated:
            for j, (s, o) in enumerate(zip(self.std_scale, self.std_scale_observed, strict=True)):
                name = "calibration_scale" if len(self.std_scale) == 1 else f"calibration_scale_{j}"
                self.log(f"{stage}/{name}", s, batch_size=batch.batch_size)
                self.log(f"{stage}/{name}_observed", o, batch_size=batch.batch_size)

    def _log_metrics(self, batch: Batch, stage: str, prefix: str, mean: Tensor, std: Tensor, weight: Tensor) -> None:
        """Update and log the metrics of one subset of the targets (``prefix``: "", "context/", "uncalibrated/"...)."""
        key = f"{stage}_{prefix.strip('/').replace('/', '_')}" if prefix else None
        metrics = self.group_metrics[key] if key else self.metrics[stage]
        y, names = batch.target.y, [*PREDICTIVE_METRICS, *COVERAGE_METRICS]
        for name in names:
            metrics[name].update(mean, std, y, weight)
        if "target_scale" in batch.extras:
            scale = batch.extras["target_scale"]
            for name in PHYSICAL_METRICS:
                metrics[name].update(mean, std, y, weight, scale)
            names += PHYSICAL_METRICS
            if "coarse_sq_err" in batch.extras:
                # Per-target squared errors [B, Nt] of the baseline, weighted as the model's (cos-latitude too).
                sq_err = batch.extras["coarse_sq_err"].float() * scale.float().view(-1, 1).square()
                metrics["baseline_rmse_physical"].update(sq_err, weight)
                names.append("baseline_rmse_physical")
        if "oracle_loglik" in batch.extras and not prefix:
            metrics["oracle_loglik"].update(batch.extras["oracle_loglik"])
            names.append("oracle_loglik")
        on_bar = ("loglik", "rmse") if stage == "val" and not prefix else ()
        for name in names:
            self.log(f"{stage}/{prefix}{name}", metrics[name], prog_bar=name in on_bar, batch_size=batch.batch_size)

    def on_train_start(self) -> None:
        """A resumed run uses the learning rate of its recipe, not the one restored with the optimiser state."""
        restore_recipe_lr(self.trainer, self.run_lr)

    def on_validation_epoch_end(self) -> None:
        self.fit_calibration()

    def on_test_start(self) -> None:
        self.warn_unfitted_calibration()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the data's normalisation statistics, names and units (``gridtnp_data``) with the weights."""
        metadata = self.data_metadata
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        describe = optional(datamodule, "variable_metadata")
        if callable(describe):
            metadata = describe() or metadata
        box = optional(datamodule, "target_box")
        if box:  # predictions of a model without a grid warn beyond it (gridtnp.inference.coverage)
            metadata = {**(metadata or {}), "box": box}
        if metadata:
            checkpoint[DATA_KEY] = metadata

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read the data description back; match the variance calibration's buffers to this module's option."""
        self.data_metadata = checkpoint.get(DATA_KEY) or self.data_metadata
        state = checkpoint.get("state_dict")
        if state is not None:
            self.match_calibration_state(state)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """Predictive ``mean``, ``std`` ``[B, Nt, Dy]`` (``samples [B, Nt, Dy, S]`` with ``predict_samples``) with the
        targets' ``x``, ``y``, ``mask`` and the batch's extras (e.g. ``hour``), on the CPU, for the PredictionWriter."""
        if batch_idx == 0:
            self.model.warn_outside_grid(batch.context, batch.target)
        target = batch.target
        chunk = max(1, TARGET_CHUNK // max(batch.batch_size, 1))
        if target.x.shape[1] > chunk and self.compiled is None:  # bounded memory however many targets
            dist = self.calibrate(self.model.forward_chunked(batch.context, target.x, chunk), batch)
        else:
            dist = self.calibrate(self(batch), batch)
        out = {"mean": dist.mean, "std": dist.stddev, "x": target.x, "y": target.y, "mask": target.mask, **batch.extras}
        if self.predict_samples:  # [B, Nt, Dy, S]: joint for a joint likelihood
            out["samples"] = draw_samples(dist, self.predict_samples).permute(1, 2, 3, 0)
        return {k: v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu() for k, v in out.items()}

    def on_fit_start(self) -> None:
        data = self.trainer.datamodule
        report_training_scale(self.trainer, self.lr, optional(data, "batch_size"), self.lr_scaling,
                              optional(data, "train_batches"))  # fmt: skip
        describe = optional(self.trainer.datamodule, "describe")
        line = describe() if callable(describe) and self.trainer.is_global_zero else None
        if line:
            print(f"gridtnp: data: {line}", flush=True)
        timer = time_budget(self.trainer)
        if self.lr_schedule == "cosine" and timer is not None and self.trainer.is_global_zero:
            steps = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else None
            either = f", or at max_steps {steps} if that comes first" if steps else ""
            print(
                f"gridtnp: lr_schedule cosine is sized to --trainer.max_time ({budget_seconds(timer):.0f} s): the "
                f"learning rate decays with elapsed time and reaches 0 when max_time stops the run{either} "
                "(not bit-reproducible: it depends on the machine's speed)",
                flush=True,
            )

    def configure_optimizers(self) -> Any:
        return adamw_with_schedule(self, self.run_lr, self.weight_decay, self.warmup_steps, self.lr_schedule)
