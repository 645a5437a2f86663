"""One evaluation of a checkpoint on a split, gathered for ``gridtnp plot`` and ``gridtnp report``.

* ``batch_outputs(module, batch)``: what the module's prediction step gives (calibrated ``std``) with the
  uncalibrated ``raw_std``, on the CPU.
* ``Evaluation``: the outputs of every batch of the split, the first tasks kept whole for maps, and the outputs in
  physical units as the DataModule's ``predictions_to_xarray`` (``gridtnp predict``'s conversion) writes them.
* ``errors_by_kind(outputs)``: standardised errors ``(mean - y) / std``, ``{"all" | "held-out" | "context":
  {"after rescaling" | "model's own std" | "model": z}}`` for the calibration figure.
* ``context_in_units(module, name, x, y, time)``: a context source's values in physical units with the checkpoint's
  statistics and climatology (``gridtnp.inference.predictions``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gridtnp.batch import Batch
from gridtnp.data.contract import optional


def batch_outputs(module: Any, batch: Batch, dist: Any = None) -> dict[str, Tensor]:
    """What ``module.predict_step`` gives for ``batch`` (calibrated ``mean``, ``std [B, Nt, Dy]``, ``x``, ``y``,
    ``mask`` and the extras, on the CPU) plus ``raw_std``, the std before the variance calibration; ``dist``: the
    module's predictive for this batch when a test step already computed it (no second forward pass)."""
    if dist is None:
        with torch.no_grad():
            dist = module(batch)
    calibrate = getattr(module, "calibrate", None)
    target = batch.target
    out = {
        "mean": dist.mean,
        "std": calibrate(dist, batch).stddev if callable(calibrate) else dist.stddev,
        "raw_std": dist.stddev,
        "x": target.x,
        "y": target.y,
        "mask": target.mask,
        **batch.extras,
    }
    return {k: v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu() for k, v in out.items()}


@dataclass
class Evaluation:
    """A split's outputs (``batch_outputs`` of every batch), its first tasks (``(batch of one, output of one)``) and,
    where the DataModule converts them, ``physical``: an ``xarray.Dataset`` in physical units (station tasks:
    ``mean``, ``std``, ``observed``, ``is_context``, ``baseline_sq_error`` on ``(time, station)``)."""

    split: str
    outputs: list[dict[str, Tensor]] = field(default_factory=list)
    tasks: list[tuple[Batch, dict[str, Tensor]]] = field(default_factory=list)
    physical: Any = None
    calibrated: bool = False

    @property
    def num_tasks(self) -> int:
        return sum(int(o["mean"].shape[0]) for o in self.outputs)

    def add(self, module: Any, batch: Batch, keep: int, dist: Any = None) -> None:
        """Add one batch's outputs (``dist``: its predictive, if already computed), keeping its first ``keep`` tasks
        whole (on the CPU) for maps."""
        from gridtnp.report.plots import task_batch

        out = batch_outputs(module, batch, dist)
        self.outputs.append(out)
        b = int(out["mean"].shape[0])
        for i in range(min(keep, b)):
            one = {k: v[i : i + 1] for k, v in out.items() if v.dim() and v.shape[0] == b}
            self.tasks.append((task_batch(batch, i), one))

    def convert(self, datamodule: Any) -> Any:
        """``physical`` from the DataModule's ``predictions_to_xarray`` (None without one, or where it cannot take
        these outputs, e.g. gridded targets of a multi-source task: those are drawn in normalised units)."""
        convert = optional(datamodule, "predictions_to_xarray")
        if convert is None or not self.outputs or "hour" not in self.outputs[0]:
            return None
        try:
            self.physical = convert(self.outputs)
        except (KeyError, ValueError, RuntimeError, IndexError) as err:
            warnings.warn(
                f"gridtnp: values drawn in normalised units: {type(datamodule).__name__}.predictions_to_xarray could "
                f"not convert these outputs ({type(err).__name__}: {err}).",
                stacklevel=2,
            )
            self.physical = None
        return self.physical


def run_split(module: Any, datamodule: Any, split: str, num_tasks: int) -> Evaluation:
    """Every batch of the ``val`` or ``test`` split through ``module`` (no metrics), the first ``num_tasks`` kept."""
    datamodule.setup("validate" if split == "val" else "test")
    loader = datamodule.val_dataloader() if split == "val" else datamodule.test_dataloader()
    evaluation = Evaluation(split, calibrated=bool(getattr(module, "variance_calibration", False)))
    for batch in loader:
        batch = module.transfer_batch_to_device(batch, module.device, 0)
        evaluation.add(module, batch, num_tasks - len(evaluation.tasks))
    evaluation.convert(datamodule)
    return evaluation


def errors_by_kind(outputs: list[dict[str, Tensor]], calibrated: bool) -> dict[str, dict[str, np.ndarray]]:
    """Standardised errors ``(mean - y) / std`` of the valid targets: pooled (``all``) and, where the batches say
    which targets were context stations (``is_context``), for ``held-out`` and ``context`` targets apart; each
    with the std after the variance calibration's rescaling (``after rescaling``) and the model's own (or the
    model's only, ``model``)."""
    stds = {"after rescaling": "std", "model's own std": "raw_std"} if calibrated else {"model": "std"}
    groups: dict[str, dict[str, list[np.ndarray]]] = {}
    for out in outputs:
        valid = out["mask"].bool() & torch.isfinite(out["y"]).all(-1)  # [B, Nt]
        kinds = {"all": valid}
        if "is_context" in out:
            context = out["is_context"].bool()
            kinds["held-out"], kinds["context"] = valid & ~context, valid & context
        for label, key in stds.items():
            z = ((out["mean"] - out["y"]) / out[key]).float()  # [B, Nt, Dy], the sign of the error maps
            for kind, keep in kinds.items():
                groups.setdefault(kind, {}).setdefault(label, []).append(z[keep].flatten().numpy())
    return {k: {label: np.concatenate(parts) for label, parts in v.items()} for k, v in groups.items()}


def variable_label(attrs: dict[str, Any], fallback: str = "value") -> str:
    """``"2 metre temperature [K]"`` from CF ``long_name`` and ``units`` attributes."""
    name = str(attrs.get("long_name") or fallback)
    for prefix in ("predictive mean of ", "predictive standard deviation of "):
        name = name.removeprefix(prefix)
    units = str(attrs.get("units", "")).strip()
    return f"{name} [{units}]" if units else name


def context_in_units(
    module: Any, name: str, x: np.ndarray, y: np.ndarray, time: Any
) -> tuple[np.ndarray, dict[str, str]] | None:
    """Context source ``name``'s normalised values ``y [M]`` at ``x [M, 2]`` (lat, lon) in physical units, with its
    ``units``/``long_name``: ``y * std + reference``, the reference being the checkpoint's hourly climatology at
    ``time`` (averaged over each cell of a gridded source, as ``gridtnp.inference.predict`` takes it off) or the
    variable's mean. None where the checkpoint has no statistics for that source."""
    import xarray as xr

    from gridtnp.inference.predictions import checkpoint_statistics, departures_from_reference
    from gridtnp.report.plots import regular_grid

    meta = getattr(module, "data_metadata", None) or {}
    sources, _, _ = checkpoint_statistics(module)
    if name not in sources or not len(x):
        return None
    mean, std = sources[name]
    variable = meta["sources"][name][0]
    attrs = {k: str(meta["variables"][variable].get(k, "")) for k in ("units", "long_name")}
    if not meta.get("climatology"):
        return y * std + mean, attrs
    coords = ("latitude", "longitude")
    grid = regular_grid(x)
    if grid is not None:
        rows, cols, flat = grid
        values = np.zeros((len(rows), len(cols)))
        zeros = xr.DataArray(values, dims=coords, coords={"latitude": rows, "longitude": cols})
    else:
        flat = np.arange(len(x))
        zeros = xr.DataArray(
            np.zeros(len(x)), dims=["point"], coords={"latitude": ("point", x[:, 0]), "longitude": ("point", x[:, 1])}
        )
    zeros = zeros.assign_coords(time=np.datetime64(time, "ns"))
    try:
        departures, _ = departures_from_reference(module, {name: zeros}, zeros, coords, None)
    except Exception:  # a checkpoint without the climatology record: no physical units for the context
        return None
    reference = -departures[name].values.reshape(-1)[flat]
    return y * std + reference, attrs
