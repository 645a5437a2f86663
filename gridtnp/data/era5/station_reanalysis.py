"""Station + reanalysis tasks (the gridded TNP paper's station experiment): ``StationReanalysisDataModule``
(registered as ``era5_stations``); its sampler ``StationReanalysisTask`` is in ``station_tasks``.

A task is one hour: context ``"grid"`` (coarsened ERA5, ``x [B, G, 2]`` = (lat, lon), ``y [B, G, V]``) and
``"stations"`` (a share of the stations, ``x [B, Nc, 2]``, ``y [B, Nc, 1]``); targets: the other stations
(``x [B, Nt, 2]``, ``y [B, Nt, 1]``), or a regular grid for predictions. Details in the DataModule's docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
from torch.utils.data import DataLoader

from gridtnp.data.climatology import CLIMATOLOGY_ATTR, computed_climatology, read_climatology
from gridtnp.data.era5.forecast_times import check_forecast_predict, split_times
from gridtnp.data.era5.station_options import (
    DEFAULT_PREDICT,
    DEFAULT_STATION_TASK,
    STATION_LOADER,
    StationPredictConfig,
    StationTaskConfig,
)
from gridtnp.data.era5.station_tasks import HourSet, Split, SplitTask, StationReanalysisTask
from gridtnp.data.era5.to_xarray import Variable, forecast_predictions, station_predictions
from gridtnp.data.layout import DIMS, DataError, coverage
from gridtnp.data.sections import (
    DEFAULT_SPLITS,
    DEFAULT_STORE,
    LoaderConfig,
    SplitDates,
    StoreConfig,
    plain,
    section,
)
from gridtnp.data.stations import snap_to_grid
from gridtnp.data.store import normalisation_stats, region_index, select
from gridtnp.data.store_datamodule import StoreDataModule
from gridtnp.registry import ConfigError, register


@register("datamodule", "era5_stations")
class StationReanalysisDataModule(StoreDataModule):
    """Station + reanalysis tasks: coarse ERA5 on the grid and some stations as context, other stations as targets.

    The gridded TNP paper's station experiment has skt on the grid and t2m at the stations (``grid_variables:
    [skt]``); the default ``[t2m]`` (the embedded sample's only variable) makes it a downscaling variant.

    Each training task is one random hour of the split; validation and test cover every hour of their dates once,
    in order (``eval_draws`` context draws per hour). Context ``"grid"``: every grid variable at
    ``time_offset_hours`` before that hour, averaged over ``c x c`` blocks (NaN-aware), at the mean coordinates of
    each block's points ``x = (lat, lon)`` in degrees, ``y [B, G, len(grid_variables)]`` (padded and masked: ``G``
    depends on the layout). The layout changes from training task to training task: ``c`` is drawn from
    ``coarsen`` and the first block edge from ``0..c-1`` fine cells along each dimension (``coarsen_offset:
    random``), so a model cannot learn where the coarse cells happen to start; evaluation uses one fixed layout
    (``eval_coarsen``, ``eval_offset``), which can be set to any other (e.g. to test a shifted lattice).
    ``coverage_dropout`` and ``eval_trim`` mask parts of training and evaluation grids out (``StationTaskConfig``).

    Context ``"stations"``: a share ``~ U[context_fraction]`` of the distinct stations inside the store's box, ``y``
    = ``station_variable`` at the station's nearest grid point (values from ERA5, as in the paper), ``x`` = that
    grid point's coordinates (so a value and its location agree; the CSV coordinates stay in ``station_table`` and
    the predictions). Targets: every
    station (``targets: all``, context stations included, so that a model learns to give back what it was shown)
    or the other stations (``held_out``). Values are normalised with the store's training-period statistics; NaNs
    are masked out (and zeroed). Stations snapping to a grid point that an earlier station already has are dropped
    (``unique_grid_points``), so no target shares its value with a context station.

    ``extras`` per task: ``target_scale`` (the station variable's std: metrics in physical units),
    ``coarse_sq_err [B, Nt]`` (squared normalised error of predicting each target by the coarse cell of the station
    variable containing it, at the grid time; 0 for masked targets), ``is_context [B, Nt]`` (the target station is
    in the context: metrics are also reported for context and held-out stations apart) and ``hour`` (index into
    the store's time axis).

    Args:
        store: the store section (``gridtnp.data.sections.StoreConfig``); ``store.region`` also bounds the stations
            and the climatology.
        splits: the train, val and test dates (``SplitDates``).
        loader: batch size, training batches per epoch, seed and workers (``LoaderConfig``; validation and test
            cover their dates, so ``val_batches`` and ``test_batches`` are unused).
        task: what a task holds (``StationTaskConfig``: variables, blocks, context share, targets, climatology).
        stations: a CSV of station locations (``latitude``, ``longitude``); None uses the embedded HadISD list.
        predict: what ``gridtnp predict`` covers (``StationPredictConfig``).
    """

    # A task reads whole fields (4 MiB a step at global 0.25 degree) and sums them in blocks: returned to the
    # kernel and faulted in again, those arrays cost a quarter of a worker's CPU (docs/data.md, "The loaders").
    keep_freed_memory = True

    MOVED_ARGUMENTS = {
        **{name: f"task.{name}" for name in StationTaskConfig.__dataclass_fields__},
        **{f"predict_{name}": f"predict.{name}" for name in StationPredictConfig.__dataclass_fields__},
    }

    def __init__(
        self,
        store: StoreConfig = DEFAULT_STORE,
        splits: SplitDates = DEFAULT_SPLITS,
        loader: LoaderConfig = STATION_LOADER,
        task: StationTaskConfig = DEFAULT_STATION_TASK,
        stations: str | None = None,
        predict: StationPredictConfig = DEFAULT_PREDICT,
    ) -> None:
        super().__init__(store, splits, loader)
        options = self.options = section(StationTaskConfig, task, "task")
        self.predict = section(StationPredictConfig, predict, "predict")
        self.save_hyperparameters(
            {
                name: plain(value)
                for name, value in zip(
                    ("store", "splits", "loader", "task", "stations", "predict"),
                    (self.store_config, self.split_dates, self.loader, options, stations, self.predict),
                    strict=True,
                )
            }
        )
        offset = None if options.coarsen_offset == "random" else options.coarsen_offset
        # layouts per split: (block sizes to draw from, fixed offset or None for random)
        self.layouts = {
            "train": (options.factors, offset),
            "eval": ([options.eval_factor], options.eval_offset),
        }
        self.stations = stations
        self.station_variable, self.grid_variables = options.station_variable, list(options.grid_variables)
        self.targets, self.eval_draws, self.eval_stride = options.targets, options.eval_draws, options.eval_stride
        self.time_features, self.climatology = bool(options.time_features), bool(options.climatology)
        self.context_fraction, self.time_offset_hours = options.context_fraction, options.time_offset_hours
        self.unique_grid_points = options.unique_grid_points
        self.random_points, self.num_targets = options.random_points, options.num_targets
        self.predict_split, self.predict_resolution = self.predict.split, self.predict.resolution
        self.lead_hours = list(options.lead_hours or ())  # forecast tasks' lead hours; [] for same-hour tasks
        check_forecast_predict(options, self.predict)
        share = self.predict.context_fraction
        self.predict_context_fraction = sum(self.context_fraction) / 2 if share is None else float(share)
        self.task: StationReanalysisTask | None = None
        self.splits: dict[str, Split] = {}
        self._climatology_record: dict[str, Any] | None = None

    geographic = True  # x = (latitude, longitude) in degrees (forecasts: hours first): plots draw maps

    @property
    def dim_x(self) -> int:
        """2: ``x = (lat, lon)``; 3 for forecast tasks: ``x = (hours from the initial hour, lat, lon)``."""
        return 3 if self.lead_hours else 2

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source; no ``"grid"`` source when ``grid_variables`` is empty."""
        if not self.grid_variables:
            return {"stations": 1}
        return {"grid": len(self.grid_variables) + 2 * self.time_features, "stations": 1}

    def setup(self, stage: str | None = None) -> None:
        """Open the store for metadata, check variables, dates and stations, and build the task sampler."""
        if self.task is not None:
            return
        from gridtnp.data.sample import STATIONS_SAMPLE, sample_path
        from gridtnp.data.stations import read_stations, station_box

        path = self.store_path()
        variables = list(dict.fromkeys([*self.grid_variables, self.station_variable]))
        ds = self.open(variables)
        region = None
        if self.region is not None:
            box = select(ds, region=self.read_region())
            if min(box.sizes["latitude"], box.sizes["longitude"]) < 2:
                raise DataError(
                    f"region {list(self.region)} holds {box.sizes['latitude']} latitude(s) x "
                    f"{box.sizes['longitude']} longitude(s) of the store {path}; a station task needs at least 2 "
                    "grid points along each. Widen the region."
                )
            region, ds = region_index(ds, box), box
        for v in variables:
            if ds[v].dims != DIMS:
                raise DataError(
                    f"{path}: variable {v!r} has dims {ds[v].dims}; station tasks need {DIMS} (select one level "
                    "when preparing the store)."
                )
        stats = {v: normalisation_stats(ds, v, source=path, given=self.stats) for v in variables}
        lat, lon = ds["latitude"].values, ds["longitude"].values
        station_file = str(self.stations if self.stations is not None else sample_path(STATIONS_SAMPLE))
        table = read_stations(station_file, lat, lon)
        keep = (table["inside"] & ~(table["duplicate"] & self.unique_grid_points)).to_numpy()
        if keep.sum() < 2:
            where = f"region {list(self.region)} of the store" if self.region is not None else "the store"
            raise DataError(
                f"{station_file}: {int(keep.sum())} distinct station(s) inside {where} {path}, which covers "
                f"{coverage(ds)}; need at least 2 (context and targets). Use a station file for this region."
            )
        kept = table[keep]
        self.station_table = kept.reset_index(drop=True)
        self._station_counts = (station_file, len(table), int(table["inside"].sum()), int(keep.sum()))
        self.time_axis, self.box, self.target_box = ds.indexes["time"], (lat, lon), station_box(kept, lat, lon)
        self.units = str(ds[self.station_variable].attrs.get("units", ""))
        self.long_name = str(ds[self.station_variable].attrs.get("long_name", self.station_variable))
        station_index = np.stack([kept["lat_index"].to_numpy(np.int64), kept["lon_index"].to_numpy(np.int64)])

        time = ds.indexes["time"]
        where = lambda name: f"{path} ({coverage(ds)}), {name} dates {' to '.join(map(str, self.dates[name]))}"  # noqa: E731
        self.splits = split_times(time, self.split_hours(ds, path), self.options, where)

        self.task = StationReanalysisTask(
            self.chunk_cache(variables, region),
            self.grid_variables,
            self.station_variable,
            stats,
            (lat, lon),
            station_index,
            {"train": self.layouts["train"], "val": self.layouts["eval"], "test": self.layouts["eval"]},
            self.context_fraction,
            self.targets,
            (time.hour + time.minute / 60.0).to_numpy(np.float64) if self.time_features else None,
            self.hourly_climatology(ds, variables, path, region) if self.climatology else None,
            time.hour.to_numpy(np.int64),
            self.random_points,
            self.num_targets,
            self.options.coverage_dropout,
            self.options.trim_sides,
        )
        if self.num_targets is not None and self.num_targets >= self.task.num_stations:
            raise ConfigError(
                f"StationReanalysisDataModule: num_targets={self.num_targets} leaves no context among "
                f"{self.task.num_stations} points."
            )

    def hourly_climatology(
        self, ds: xr.Dataset, variables: Sequence[str], path: str, region: dict[str, slice] | None = None
    ) -> dict[str, np.ndarray]:
        """``{variable: [24, H * W]}``: the mean at each grid point and UTC hour of day over the training hours,
        read from the store when ``gridtnp data prepare --climatology`` stored it for those hours, else computed
        from the store (a pass over the training period)."""
        hours, record = self.splits["train"].hours, ds.attrs.get(CLIMATOLOGY_ATTR)
        options = {"storage_options": self.storage_options, "region": region, "west": self.west()}
        stored = read_climatology(path, variables, ds.indexes["time"], hours, record, **options)
        if stored is not None:
            return stored
        start, end = self.dates["train"]
        return computed_climatology(ds, variables, hours, f"{path}, training dates {start} to {end}")

    def variable_metadata(self) -> dict[str, Any] | None:
        """The ERA5 DataModules' record (``StoreDataModule.variable_metadata``), plus, when the values are departures
        from the training dates' hourly climatology, that climatology: ``{"latitude": [H], "longitude": [W],
        "variables": {name: [24, H, W]}}`` (tensors, so that ``gridtnp.predictions.predict`` can serve a checkpoint
        alone; 24 x H x W floats per variable)."""
        metadata = super().variable_metadata()
        if metadata is None or not self.climatology or self.task is None or self.task.climatology is None:
            return metadata
        if self._climatology_record is None:  # built once: every checkpoint save asks for it
            lat, lon = self.box
            self._climatology_record = {
                "latitude": torch.from_numpy(lat.astype(np.float64)),
                "longitude": torch.from_numpy(lon.astype(np.float64)),
                "variables": {
                    v: torch.from_numpy(c.reshape(24, len(lat), len(lon))) for v, c in self.task.climatology.items()
                },
            }
        return {**metadata, "climatology": self._climatology_record}

    def predict_points(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``predict_resolution`` grid over the store's box: ``(lat [H], lon [W])``, or None (stations)."""
        if self.predict_resolution is None:
            return None
        lat, lon = self.box
        r = self.predict_resolution
        return np.arange(lat.min(), lat.max() + r / 2, r), np.arange(lon.min(), lon.max() + r / 2, r)

    def predict_dataloader(self) -> DataLoader:
        """Every hour of ``predict_split`` in order, ``batch_size`` hours a batch, context drawn with a fixed seed."""
        self.setup()
        points, target_x = self.predict_points(), None
        if points is not None:
            lat, lon = np.meshgrid(*points, indexing="ij")
            target_x = np.stack([lat.ravel(), lon.ravel()], -1)  # [H * W, 2]
        assert self.task is not None
        split = self.splits[self.predict_split]
        share = self.predict_context_fraction
        dataset = HourSet(self.task, split, self.batch_size, self.seed, "predict", 1, share, target_x)
        return DataLoader(dataset, shuffle=False, **self.loader_kwargs())

    def source_variables(self) -> dict[str, list[str]]:
        """``grid_variables`` on ``"grid"`` (when any), ``station_variable`` at ``"stations"``."""
        grid = {"grid": list(self.grid_variables)} if self.grid_variables else {}
        return {**grid, "stations": [self.station_variable]}

    def target_variables(self) -> list[str]:
        """The station variable."""
        return [self.station_variable]

    def describe(self) -> str:
        """One line on what the tasks hold (after ``setup``), printed at the start of ``gridtnp fit``."""
        file, total, inside, kept = self._station_counts
        (factors, offset), hours = self.layouts["train"], {k: len(v.target_time) for k, v in self.splits.items()}
        tasks = {k: -(-hours[k] // self.eval_stride) * self.eval_draws for k in ("val", "test")}
        points = f"{self.random_points:,} random grid points a task instead of " if self.random_points else ""
        per_task = f" ({self.num_targets:,} a task)" if self.num_targets else ""
        return (
            f"{points}{kept:,} stations of {total:,} in {Path(file).name} ({total - inside:,} outside "
            f"{'the region' if self.region is not None else 'the store'}, {inside - kept:,} sharing a grid point "
            f"dropped) on {len(self.box[0]):,} x {len(self.box[1]):,} grid points; grid "
            f"{', '.join(self.grid_variables) or 'none'} in {' or '.join(f'{c} x {c}' for c in factors)} blocks ("
            f"{'random offsets' if offset is None else f'offset {list(offset)}'}); targets {self.targets}{per_task}; "
            f"train {hours['train']:,} hours, " + ", ".join(f"{k} {n:,} task{'s' * (n != 1)}" for k, n in tasks.items())
        )

    def eval_dataset(self, split: str) -> HourSet:
        """Every (``eval_stride``-th) hour of the ``"val"`` or ``"test"`` dates once, in order, ``eval_draws`` tasks
        per hour."""
        self.setup()
        assert self.task is not None
        split_hours = self.splits[split]
        return HourSet(
            self.task, split_hours, self.batch_size, self.seed, split, self.eval_draws, stride=self.eval_stride
        )

    def predictions_to_xarray(self, outputs: Sequence[dict[str, torch.Tensor]]) -> xr.Dataset:
        """``gridtnp predict`` outputs -> ``mean``, ``std`` in physical units on ``(time, station)`` with station
        coordinates (and ``observed``, ``is_context``), or on ``(time, latitude, longitude)``."""
        assert self.task is not None
        variable = Variable(
            self.station_variable,
            self.long_name,
            self.units,
            float(self.task.station_mean),
            float(self.task.station_std),
        )
        attrs = {"predict_split": self.predict_split, "predict_context_fraction": self.predict_context_fraction}
        if self.lead_hours:  # (init_time, lead_time, station), the climatology added back at each valid hour
            return forecast_predictions(outputs, self, variable, attrs)
        if self.predict_points() is None:
            outputs = [self.on_stations(o) for o in outputs]
        if self.climatology:  # departures -> values: add the climatology back, in the normalised units
            flat = self.prediction_cells()
            outputs = [self._add_climatology(o, variable, flat) for o in outputs]
        return station_predictions(
            outputs, self.time_axis, variable, self.station_table, self.predict_points(), self.store_path(), attrs
        )

    def on_stations(self, output: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A batch's outputs with the targets on every station in ``station_table`` order: the per-target tensors
        ``[B, P, ...]`` of a test batch whose targets are some stations (``targets: held_out``) are scattered to
        ``[B, S, ...]`` by their location (NaN, 0 or False, and masked, at stations that were not targets)."""
        assert self.task is not None
        station_x = torch.from_numpy(self.task.station_x)
        x = output.get("x")
        s = len(station_x)
        if x is None or (x.shape[1] == s and bool((x == station_x).all())):  # without x: in station order
            return output
        b, p = x.shape[:2]
        # Each location (two float32 coordinates, bit for bit) as one int64 key, looked up among the stations' keys.
        keys = np.ascontiguousarray(self.task.station_x, dtype=np.float32).view(np.int64)[:, 0]  # [S]
        query = np.ascontiguousarray(x.reshape(-1, 2).numpy(), dtype=np.float32).view(np.int64)[:, 0]  # [B * P]
        order = np.argsort(keys, kind="stable")
        at = np.clip(np.searchsorted(keys[order], query), 0, s - 1)
        where = torch.from_numpy(np.where(keys[order][at] == query, order[at], -1).reshape(b, p))
        keep = (where >= 0) & output["mask"].bool()
        rows = torch.arange(b)[:, None].expand(b, p)[keep]
        out = dict(output)
        for key, value in output.items():
            if value.dim() < 2 or value.shape[:2] != (b, p):
                continue
            fill = float("nan") if value.is_floating_point() else 0
            full = torch.full((b, s, *value.shape[2:]), fill, dtype=value.dtype)
            full[rows, where[keep]] = value[keep]
            out[key] = full
        out["x"] = station_x.expand(b, s, 2)
        return out

    def prediction_cells(self) -> np.ndarray:
        """Flat index ``[P]`` of the store's grid point under each prediction point (a station's own point, or the
        nearest to each point of the ``predict_resolution`` grid)."""
        assert self.task is not None
        points = self.predict_points()
        if points is None:
            return self.task.station_flat
        lat, lon = (axis.ravel() for axis in np.meshgrid(*points, indexing="ij"))
        snapped = snap_to_grid(pd.DataFrame({"latitude": lat, "longitude": lon}), *self.box)
        return snapped.lat_index * len(self.box[1]) + snapped.lon_index

    def _add_climatology(
        self, output: dict[str, torch.Tensor], variable: Variable, flat: np.ndarray
    ) -> dict[str, torch.Tensor]:
        """A predict batch's ``mean`` and ``y`` ``[B, P, 1]`` with the climatology at its hours and grid points
        ``flat [P]`` added, in the units ``variable``'s mean and std normalise."""
        assert self.task is not None
        reference = self.task.reference(self.station_variable, output["hour"].numpy(), flat)  # [B, P]
        shift = torch.from_numpy((reference - variable.mean) / variable.std).unsqueeze(-1)
        return {k: v + shift.to(v.dtype) if k in ("mean", "y") else v for k, v in output.items()}

    def split_task(self, name: str) -> SplitTask:
        """The task generator of split ``name``, reading only that split's hours."""
        self.setup()
        assert self.task is not None
        if name == "train":  # here, in the main process: DataLoader workers inherit the tables instead of each
            self.task.build_tables("train")  # building them in its first batches
        return SplitTask(self.task, self.splits[name], self.tasks_per_read if name == "train" else 1)
