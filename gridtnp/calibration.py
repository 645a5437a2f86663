"""Variance calibration of ``NeuralProcessModule`` (``variance_calibration: true``) and ``observed_targets``.

After every validation during ``fit`` (not the sanity
check), one scale per output ``s^2 = weighted mean z^2`` of the uncalibrated predictive over the validation set
is stored in the buffer ``std_scale`` ``[Dy]`` (saved in every checkpoint, including the best one, written after
the validation it was fitted on) and logged as ``val/calibration_scale``. Targets at the location of a context
point of the target source (``observed_targets``: a station that is also in the context) get their own scale,
``std_scale_observed`` (``val/calibration_scale_observed``; the other scale where validation had none): a model
nearly returns an observed value there, so its error is orders of magnitude below the others'. Validation
metrics, and so the checkpoint monitor ``val/loglik``, are always of the uncalibrated predictive (the scales are
fitted on them). Test and predict multiply the predictive std by these scales: ``test/{name}`` are calibrated and
``test/uncalibrated/{name}`` are reported besides. ``gridtnp.inference.predict`` applies it too.
"""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.distributions import Normal

from gridtnp.batch import Batch
from gridtnp.metrics import StandardisedSquareByOutput
from gridtnp.nn.lowrank_normal import rescaled
from gridtnp.nn.neighbours import knn_points


class VarianceCalibration:
    """The variance calibration of a LightningModule (a mixin): its buffers, fit after each validation, applied by
    ``calibrate``. The module calls ``init_calibration`` in ``__init__`` and the hooks' methods below."""

    def init_calibration(self, variance_calibration: bool, dim_y: int) -> None:
        """Register ``std_scale``, ``std_scale_observed`` ``[Dy]`` and ``std_scale_fitted`` when calibrating."""
        self.variance_calibration = variance_calibration
        if variance_calibration:
            self.register_buffer("std_scale", torch.ones(dim_y))
            self.register_buffer("std_scale_observed", torch.ones(dim_y))
            self.register_buffer("std_scale_fitted", torch.tensor(False))
            self.calibration_sums = StandardisedSquareByOutput(dim_y)
            self.calibration_sums_observed = StandardisedSquareByOutput(dim_y)

    def calibrate(self, dist: Normal, batch: Batch | None = None) -> Normal:
        """``dist`` ``[B, Nt, Dy]`` with its std multiplied by the fitted ``std_scale``, and by ``std_scale_observed``
        at the ``batch``'s observed targets (unchanged without variance calibration)."""
        if not self.variance_calibration:
            return dist
        scale = self.std_scale.to(dist.stddev.dtype)
        if batch is not None:
            observed = observed_targets(batch, self.target_source).unsqueeze(-1)  # [B, Nt, 1]
            scale = torch.where(observed, self.std_scale_observed.to(scale), scale)
        return rescaled(dist, dist.mean, scale)  # a joint predictive's correlations are kept

    def fit_calibration(self) -> None:
        """With variance calibration, fit ``std_scale`` to this validation's uncalibrated predictive (not the sanity
        check's, which sees only a few batches)."""
        if not self.variance_calibration:
            return
        if self._trainer is not None and self.trainer.sanity_checking:
            self.calibration_sums.reset()
            self.calibration_sums_observed.reset()
            return
        if float(self.calibration_sums.weight) > 0 or (self._trainer is not None and self.trainer.world_size > 1):
            scale = self.calibration_sums.compute().sqrt()  # [Dy]; collective calls under DDP, so on every rank
            observed = self.calibration_sums_observed.compute().sqrt()
            if bool(torch.isfinite(scale).all() and (scale > 0).all()):
                self.std_scale.copy_(scale.to(self.std_scale))
                usable = bool(torch.isfinite(observed).all() and (observed > 0).all())
                self.std_scale_observed.copy_((observed if usable else scale).to(self.std_scale))
                self.std_scale_fitted.fill_(True)
                for j, (s, o) in enumerate(zip(self.std_scale, self.std_scale_observed, strict=True)):
                    name = "calibration_scale" if len(self.std_scale) == 1 else f"calibration_scale_{j}"
                    self.log(f"val/{name}", s)
                    if usable:
                        self.log(f"val/{name}_observed", o)
        self.calibration_sums.reset()
        self.calibration_sums_observed.reset()

    def warn_unfitted_calibration(self) -> None:
        """Say that test metrics are uncalibrated when the scales were never fitted."""
        if self.variance_calibration and not bool(self.std_scale_fitted):
            rank_zero_warn(
                "gridtnp: variance_calibration is on but this model's std_scale was never fitted (no validation ran "
                "during fit, or the checkpoint predates it): test/ metrics are those of the uncalibrated predictive."
            )

    def match_calibration_state(self, state: dict) -> None:
        """Match a checkpoint's ``state_dict`` to this module's option: default scales added, or dropped with a
        warning when this model does not calibrate."""
        if self.variance_calibration:
            state.setdefault("std_scale", torch.ones_like(self.std_scale))
            state.setdefault("std_scale_observed", state["std_scale"].clone())  # one scale for every target
            state.setdefault("std_scale_fitted", torch.tensor(False))
        elif "std_scale" in state:
            rank_zero_warn(
                f"gridtnp: the checkpoint has a fitted variance calibration (std_scale {state['std_scale'].tolist()}) "
                "that this model ignores: set --model.init_args.variance_calibration true to apply it."
            )
            state.pop("std_scale")
            state.pop("std_scale_observed", None)
            state.pop("std_scale_fitted", None)


def observed_targets(batch: Batch, source: str | None) -> Tensor:
    """``[B, Nt]``: True where a valid target lies at a valid context point of ``source`` (its location, to float32
    rounding), e.g. a station that is also in the context. ``source`` None: the batch's only context source, if any."""
    target = batch.target
    if source is None and len(batch.context) == 1:
        source = next(iter(batch.context))
    context = batch.context.get(source) if source is not None else None
    if context is None or context.x.shape[1] == 0 or target.x.shape[1] == 0:
        return torch.zeros(target.x.shape[:2], dtype=torch.bool, device=target.x.device)
    xc, xt = context.x.detach().float(), target.x.detach().float()
    index, valid = knn_points(xc, context.valid(), xt, 1)  # [B, Nt, 1]
    nearest = torch.gather(xc, 1, index[..., 0].unsqueeze(-1).expand(-1, -1, xc.shape[-1]))  # [B, Nt, d]
    tolerance = 1e-6 * (1.0 + xt.abs().amax(-1))
    return valid[..., 0] & target.valid() & ((nearest - xt).abs().amax(-1) <= tolerance)
