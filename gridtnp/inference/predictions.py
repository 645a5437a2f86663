"""Predictions as ``xarray.Dataset``: the ``gridtnp predict`` writer and a Python API for a user's own xarray data.

``gridtnp predict --config recipe.yaml --ckpt_path last.ckpt [--predictions.path out.nc]`` runs the model over the
DataModule's prediction batches and writes the predictive mean and standard deviation, in the data's physical
units with CF attributes, as NetCDF (``.nc``) or Zarr (``.zarr``). The DataModule says how its batches map to
coordinates (``predictions_to_xarray``); without that method the writer stores the raw tensors per task.

In a notebook, ``predict(module, context, targets)`` does the same for xarray inputs, equal to the module's
``predict_step`` on the same tasks: its inputs are checked and converted in ``inference.inputs``, the cells of a
gridded context are ``inference.cells``, the checkpoint's climatology is taken off and added back in
``inference.climatology``, and a grid that leaves the model's domain uncovered is warned of in
``inference.coverage`` (by the writer too, on ``gridtnp predict``'s first batch).

* ``PredictionWriter(path)``: the callback behind ``gridtnp predict``.
* ``write_dataset(ds, path)``: NetCDF or Zarr by suffix, written beside ``path`` and then moved into place.
* ``is_prediction_file(path)``: whether ``path`` holds gridtnp predictions (``gridtnp predict`` replaces nothing
  else, and only with ``--predictions.overwrite true``).
* ``raw_predictions(outputs)``: ``mean, std [task, point, Dy]`` and ``x [task, point, Dx]`` when the DataModule
  has no ``predictions_to_xarray``.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
import zarr
from lightning.pytorch.callbacks import BasePredictionWriter

from gridtnp.batch import Batch, Observations
from gridtnp.data.contract import optional
from gridtnp.files import check_output, out_of_space, remove_path, replace_path, replacing
from gridtnp.inference.cells import gridded_context
from gridtnp.inference.cf import attribution_of, cf_predictions, context_flags, prediction_dataset
from gridtnp.inference.climatology import departures_from_reference
from gridtnp.inference.coverage import warn_uncovered, warn_uncovered_batch
from gridtnp.inference.inputs import (
    RAW_UNITS,
    UNITLESS,
    Stats,
    check_context,
    checkpoint_statistics,
    geographic_inputs,
    longitude_centre,
    observations,
    points,
    station_targets,
    template,
)
from gridtnp.inference.samples import attach_samples, raw_predictions, with_samples
from gridtnp.inference.stopping import StopSignals, stop_line
from gridtnp.models.neural_process import TARGET_CHUNK
from gridtnp.nn.lowrank_normal import draw_samples
from gridtnp.redaction import redact_text
from gridtnp.registry import ConfigError

#: Names other modules read from here (``gridtnp.report.evaluation``, user code).
__all__ = [
    "RAW_UNITS",
    "UNITLESS",
    "PredictionWriter",
    "checkpoint_statistics",
    "departures_from_reference",
    "geographic_inputs",
    "is_prediction_file",
    "longitude_centre",
    "predict",
    "raw_predictions",
    "write_dataset",
]


class PredictionWriter(BasePredictionWriter):
    """Writes ``gridtnp predict``'s outputs as an ``xarray.Dataset`` to ``path`` (``.nc`` or ``.zarr``).

    A Zarr store is written as the batches come, ``tasks_per_write`` tasks at a time appended along time (forecasts:
    along init_time), so memory stays bounded however many hours are predicted (a year of hourly predictions at
    9,000 stations would otherwise hold about 2 GB of outputs, more once converted); NetCDF, and outputs a
    DataModule cannot convert (``raw_predictions``), are written once at the end. Either way the file appears at
    ``path`` only when complete.
    SIGTERM or SIGHUP stops the run after the batch being written, the predictions so far written as a valid file
    marked ``gridtnp_incomplete`` (``inference.stopping``); the process exits with status 128 + signal.

    Args:
        path: output file; default ``<log dir>/predictions.nc``. Under DDP each rank writes its own part,
            ``<stem>.rank<r><suffix>``.
        overwrite: replace an existing file at ``path``, if it holds gridtnp predictions (never anything else,
            such as the data store being read).
        tasks_per_write: tasks converted and appended to a Zarr store at a time.
        samples: samples of the predictive per task written as ``<variable>_sample`` (a trailing ``sample``
            dimension; ``inference.samples``): joint over a task's targets for a joint likelihood; 0: none.
    """

    def __init__(
        self, path: str | None = None, overwrite: bool = False, tasks_per_write: int = 256, samples: int = 0
    ) -> None:
        super().__init__(write_interval="batch")
        if path is not None and Path(path).suffix not in (".nc", ".zarr"):
            raise ConfigError(f"predictions.path {path!r}: expected a .nc (NetCDF) or .zarr file name.")
        if tasks_per_write < 1:
            raise ConfigError(f"predictions.tasks_per_write {tasks_per_write}: expected at least 1.")
        if samples < 0:
            raise ConfigError(f"predictions.samples {samples}: expected 0 (none) or more.")
        self.path, self.overwrite, self.tasks_per_write, self.samples = path, overwrite, tasks_per_write, samples
        self.recipe: list[str] = []  # set by the CLI: the recipe file(s) used
        self.written: Path | None = None
        self._pending: list[Any] = []
        self._partial: Path | None = None  # the Zarr store being appended to, beside ``path``
        self._attribution: dict[str, Any] | None = None  # the store's licence, source, ... (read once)
        self.signals = StopSignals()
        self.incomplete: str | None = None  # why the file holds only part of the predictions

    def output_path(self, trainer: Any) -> Path:
        """Where this rank writes: ``path`` (or the default in the log directory), per rank under DDP."""
        path = Path(self.path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.nc")
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse an existing output before any prediction is made (``check_output``)."""
        option = "--predictions.overwrite true"
        check_output(self.output_path(trainer), "prediction file", option, self.overwrite, is_prediction_file)
        self._pending, self._partial, self.written, self._attribution = [], None, None, None
        self.incomplete = None
        pl_module.predict_samples = self.samples
        self.signals.install()

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.signals.restore()

    def write_on_batch_end(
        self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if batch_idx == 0 and dataloader_idx == 0 and isinstance(batch, Batch):  # the check predict makes
            warn_uncovered_batch(pl_module, batch.context, batch.target)
        self._pending.append(prediction)
        streamed = self.output_path(trainer).suffix == ".zarr" and self._convert(trainer) is not None
        if streamed and sum(len(o["mean"]) for o in self._pending) >= self.tasks_per_write:
            self._append(trainer, pl_module)
        if self.signals.received is not None:
            self._stop(trainer, pl_module, batch_idx, dataloader_idx)

    def _stop(self, trainer: Any, pl_module: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Write what was predicted so far as a complete file, say how to go on, and exit (128 + signal)."""
        signum = self.signals.received or signal.SIGTERM
        self.signals.restore()
        total = list(getattr(trainer, "num_predict_batches", None) or [])
        of = f" of {total[dataloader_idx]}" if dataloader_idx < len(total) else ""
        self.incomplete = f"stopped by {signal.Signals(signum).name} after batch {batch_idx + 1}{of}"
        self.on_predict_epoch_end(trainer, pl_module)
        if trainer.is_global_zero:
            print(stop_line(self.incomplete, self.output_path(trainer)), file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Write what is left and move the file into place."""
        path = self.output_path(trainer)
        if self._partial is not None:  # a Zarr store written as the batches came
            if self._pending:
                self._append(trainer, pl_module)
            if self.incomplete:
                zarr.open_group(str(self._partial), mode="r+").attrs["gridtnp_incomplete"] = self.incomplete
            zarr.consolidate_metadata(str(self._partial))
            replace_path(self._partial, path)
            self._partial = None
        elif self._pending:
            outputs, self._pending = self._pending, []
            convert = self._convert(trainer)
            to_dataset = (lambda o: self._cf(convert(o), trainer, pl_module)) if convert else raw_predictions
            ds = with_samples(to_dataset, outputs)
            write_dataset(self._described(ds, trainer, pl_module), path)
        else:
            return
        self.written = path
        print(f"gridtnp: predictions written to {path}")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.signals.restore()
        if self._partial is not None:  # an interrupted prediction leaves no partial store behind
            remove_path(self._partial)
            self._partial = None

    def _convert(self, trainer: Any) -> Any:
        return optional(trainer.datamodule, "predictions_to_xarray")

    def _append(self, trainer: Any, pl_module: Any) -> None:
        """Convert the pending outputs and write them to the partial Zarr store, after what it holds along time."""
        outputs, self._pending = self._pending, []
        ds = with_samples(lambda o: self._cf(self._convert(trainer)(o), trainer, pl_module), outputs)
        ds = self._described(ds, trainer, pl_module)
        if self._partial is None:
            path = self.output_path(trainer)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._partial = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
            ds.to_zarr(self._partial, mode="w", zarr_format=2, consolidated=False)
        else:
            dim = "init_time" if "init_time" in ds.dims else "time"  # forecasts: (init_time, lead_time, ...)
            appended = [name for name, var in ds.variables.items() if dim in var.dims]
            ds[appended].to_zarr(self._partial, append_dim=dim, consolidated=False)

    def _cf(self, ds: xr.Dataset, trainer: Any, pl_module: Any) -> xr.Dataset:
        """The DataModule's predictions as the CF dataset ``predict`` returns too (``inference.cf``): named for the
        predicted variables, with the store's attribution."""
        if self._attribution is None:
            self._attribution = store_attribution(trainer.datamodule)
        metadata = getattr(pl_module, "data_metadata", None) or {}
        if not metadata and callable(optional(trainer.datamodule, "variable_metadata")):
            metadata = trainer.datamodule.variable_metadata() or {}
        return cf_predictions(ds, list(metadata.get("target") or []), self._attribution)

    def _described(self, ds: xr.Dataset, trainer: Any, pl_module: Any) -> xr.Dataset:
        """``ds`` with the run's provenance: checkpoint, recipe (its text, secrets redacted) and model class."""
        ds.attrs["checkpoint"] = str(trainer.ckpt_path) if trainer.ckpt_path else "none (initial weights)"
        ds.attrs["recipe"] = ", ".join(self.recipe) or "none"
        for i, recipe in enumerate(self.recipe):
            if os.path.isfile(recipe):
                ds.attrs[f"recipe_text_{i}" if i else "recipe_text"] = redact_text(Path(recipe).read_text())
        ds.attrs["model"] = type(getattr(pl_module, "model", pl_module)).__name__
        if self.incomplete:
            ds.attrs["gridtnp_incomplete"] = self.incomplete
        return ds


def store_attribution(datamodule: Any) -> dict[str, Any]:
    """The licence, source, institution, ... of the store a DataModule reads (``store_path``); empty without one."""
    path = getattr(datamodule, "store_path", None)
    if not callable(path):
        return {}
    try:
        with xr.open_zarr(path(), chunks=None, storage_options=getattr(datamodule, "storage_options", None)) as ds:
            return attribution_of(ds)
    except Exception:  # a store that cannot be opened here has already been reported by the DataModule
        return {}


def is_prediction_file(path: Path) -> bool:
    """Whether ``path`` is a NetCDF file or Zarr store of gridtnp predictions (its ``source`` attribute says so)."""
    try:
        ds = xr.open_zarr(path) if path.suffix == ".zarr" else xr.open_dataset(path)
    except Exception:  # not a dataset at all (or not readable): not ours to replace
        return False
    with ds:
        return str(ds.attrs.get("source", "")).startswith(
            ("gridtnp predictions", "gridtnp.predictions", "gridtnp.inference")
        )


def write_dataset(ds: xr.Dataset, path: str | os.PathLike[str]) -> Path:
    """Write ``ds`` as NetCDF or Zarr (by suffix), replacing ``path`` only once the new file is complete."""
    path = Path(path)
    try:
        with replacing(path) as tmp:
            if path.suffix == ".zarr":
                ds.to_zarr(tmp, mode="w", zarr_format=2, consolidated=True)
            else:
                ds.to_netcdf(tmp)
    except Exception as err:
        if out_of_space(err, path.parent):
            raise ConfigError(
                f"no space left on device writing {path}; free space or choose another --predictions.path."
            ) from err
        raise
    return path


@torch.no_grad()
def predict(
    module: torch.nn.Module,
    context: Mapping[str, xr.DataArray | xr.Dataset],
    targets: xr.DataArray | xr.Dataset | pd.DataFrame,
    coords: Sequence[str] = ("latitude", "longitude"),
    stats: Mapping[str, Stats] | None = None,
    target_stats: Stats | None = None,
    batch_dim: str | None = None,
    target_chunk: int = TARGET_CHUNK,
    attrs: Mapping[str, Any] | None = None,
    samples: int = 0,
) -> xr.Dataset:
    """Predictive ``mean`` and ``std`` at the points of ``targets``, given xarray context, as an ``xarray.Dataset``.

    ``context`` maps each of the model's context sources to a DataArray of values (NaN = missing) whose ``coords``
    (e.g. latitude and longitude, in the model's input order) locate every element: a gridded field
    ``(latitude, longitude)`` or stations ``(station,)`` with latitude/longitude coordinates. ``targets`` is any
    DataArray/Dataset with those coordinates, or a table of station reports (``pandas.DataFrame`` with
    ``station_id``, ``latitude``, ``longitude``, e.g. ``gridtnp.data.observations.read_observations``'s: each
    station once, its id kept); the result has its dims and coordinates, as CF (``inference.cf``): station time
    series or maps, with ``attrs`` (the input's global attributes) carried over. ``stats[source] = (mean,
    std)`` normalise the context values and ``target_stats`` un-normalises the predictions (the statistics the
    model was trained with, e.g. ``gridtnp.data.store.normalisation_stats``); without them, those the module's
    checkpoint keeps are used (``NeuralProcessModule`` saves the ERA5 DataModules' statistics, variable names and
    units: then context values are in physical units and so is the result, with the target's ``units`` and
    ``long_name``). A checkpoint trained on departures from an hourly climatology (``StationReanalysisDataModule
    climatology: true``) keeps it: without ``stats``, the climatology at the context's ``time`` coordinate is taken
    off the context and added back to the mean: over each cell of a gridded source (its extent from CF ``bounds``
    when the source is a Dataset holding them, else from the spacing of the cell centres around it, partial edge
    cells included), at the nearest grid point of a point table. A grid with 2-D latitude/longitude coordinates is
    read as a grid when they form a rectilinear grid; a curvilinear one is refused there. A module with a fitted
    variance calibration scales the std: by its ``std_scale_observed`` at targets that are context points of the
    target source (a context station), by ``std_scale`` elsewhere, as ``gridtnp test`` does. A gridded context that
    leaves more than ``inference.coverage.UNCOVERED_SHARE`` of the model's domain or of the targets' surroundings
    without a value is warned of, in one line.
    Targets are decoded ``target_chunk`` points (over all tasks) at a time after one pass over the context, so
    memory stays bounded however many targets there are.
    ``batch_dim`` (e.g. ``"time"``), present on every context array, gives one task per entry. ``module`` is a
    ``NeuralProcessModule`` or a ``NeuralProcess``. ``samples`` > 0 adds that many samples of the predictive as
    ``<variable>_sample`` with a trailing ``sample`` dimension (``inference.samples``; joint for a joint likelihood).

    Inputs are checked where they enter: latitudes outside [-90, 90] are refused, longitudes are wrapped into
    [-180, 180) (a 0-360 field is read correctly; for a model whose grid is a box across the date line, within 180
    degrees of its middle: -170 reads as 190 for a grid from 140 to 200), +-inf values are missing like NaN, and
    context values in physical units without any statistics are refused (a ``units`` attribute, or mean or std above
    ``RAW_UNITS``), as are values that the statistics do not bring near the normalised range.
    """
    model = getattr(module, "model", module)
    if isinstance(targets, pd.DataFrame):  # a table of station reports, e.g. read_observations'
        targets = station_targets(targets)
    attribution = attribution_of(*([attrs] if attrs is not None else []), *context.values(), targets)
    context, bounds = gridded_context(context, coords)
    context = check_context(model, context, coords, batch_dim)
    saved, saved_targets, target_attrs = checkpoint_statistics(module)
    climatology = (getattr(module, "data_metadata", None) or {}).get("climatology")
    target_reference = None
    if climatology and (stats is None) != (target_stats is None):
        raise ConfigError(
            "predict: this checkpoint was trained on departures from an hourly climatology; pass both stats and "
            "target_stats (for departures you took yourself) or neither (predict takes the climatology it keeps "
            "off the context and adds it back)."
        )
    if climatology and stats is None and target_stats is None:
        # Trained on departures from an hourly climatology: subtract it from the context, add it back to the mean.
        context, target_reference = departures_from_reference(module, context, targets, coords, batch_dim, bounds)
        saved = {name: (0.0, std) for name, (_, std) in saved.items()}
        saved_targets = [(0.0, std) for _, std in saved_targets]
    obs, centre = {}, longitude_centre(model, coords)
    for name, array in context.items():
        given = (stats or {}).get(name)
        origin = "the given stats" if given is not None else "the checkpoint's statistics"
        obs[name] = observations(name, array, coords, batch_dim, given or saved.get(name), origin, centre)
    sizes = {o.x.shape[0] for o in obs.values()}
    if len(sizes) != 1:
        raise ConfigError(f"predict: the context sources have different numbers of tasks along {batch_dim!r}: {sizes}.")
    b = sizes.pop()
    spanning = template(targets, coords)
    if batch_dim is not None and batch_dim in spanning.dims:  # targets given per task (a field with its time axis)
        if any(batch_dim in spanning[c].dims for c in coords):
            raise ConfigError(f"predict: targets' {', '.join(coords)} vary along {batch_dim!r}; give one set of them.")
        spanning = spanning.isel({batch_dim: 0}, drop=True)  # the same points for every task
    target_x = points(spanning, coords, "targets", centre)  # [N, Dx]
    warn_uncovered(module, context, coords, batch_dim, bounds, target_x, centre)
    xt = torch.from_numpy(target_x).expand(b, -1, -1)
    device = next(model.parameters()).device
    batch = Batch(obs, Observations(xt)).to(device)
    model.warn_outside_grid(batch.context, batch.target)
    was_training = model.training
    model.eval()
    try:
        chunk = max(1, target_chunk // max(b, 1))
        chunked = getattr(model, "forward_chunked", None)
        dist = chunked(batch.context, batch.target.x, chunk) if chunked else model(batch.context, batch.target.x)
    finally:
        model.train(was_training)
    calibrate = getattr(module, "calibrate", None)  # with the batch: context stations get their own scale
    dist = calibrate(dist, batch) if callable(calibrate) else dist
    mean, std = dist.mean.float().cpu().numpy(), dist.stddev.float().cpu().numpy()  # [B, N, Dy]
    draws = list(draw_samples(dist, samples).float().cpu().numpy()) if samples else []  # S x [B, N, Dy]
    outputs = [target_stats] * mean.shape[-1] if target_stats is not None else saved_targets
    described: list[dict[str, str]] = [{}] * mean.shape[-1]
    names: list[str] = []
    if len(outputs) == mean.shape[-1]:
        offset, factor = np.array([o[0] for o in outputs]), np.array([o[1] for o in outputs])
        mean, std, draws = mean * factor + offset, std * factor, [d * factor + offset for d in draws]
        if target_stats is None and len(target_attrs) == mean.shape[-1]:
            described = target_attrs
            names = [str(v) for v in (getattr(module, "data_metadata", None) or {}).get("target", [])]
    if target_reference is not None:
        mean, draws = mean + target_reference, [d + target_reference for d in draws]
    first = next(iter(context.values()))
    time = first.coords.get(batch_dim) if batch_dim is not None else first.coords.get("time")
    flags = context_flags(module, batch)
    ds = prediction_dataset(mean, std, spanning, batch_dim, time, names, described, flags, attribution)
    made = [prediction_dataset(d, std, spanning, batch_dim, time, names, described, None, {}) for d in draws]
    return attach_samples(ds, made)
