"""ERA5 task DataModules: station + reanalysis (t2m at weather stations) and multi-source spatio-temporal tasks.

Both read a prepared Zarr store (``gridtnp data prepare``; see ``gridtnp.data.store``) lazily, one time chunk at a
time, and are imported on first use so that ``import gridtnp`` does not load xarray.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import xarray as xr
from torch.utils.data import DataLoader, Dataset

from gridtnp.batch import Batch, Observations
from gridtnp.data.datamodules import TaskDataModule, check_counts, generator_from
from gridtnp.data.layout import DIMS, DataError, coverage, select_time
from gridtnp.data.store import ChunkCache, coarsen_fields, normalisation_stats, open_store, select
from gridtnp.data.tasks import check_range
from gridtnp.registry import ConfigError, register

SAMPLE_CACHE_NAME = "era5_t2m_uk_2019-03"
SAMPLE_TRAIN_DATES = ("2019-03-01", "2019-03-21")


def check_fraction_range(where: str, name: str, value: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` as floats, or a ConfigError unless ``0 <= a <= b <= 1``."""
    low, high = check_range(where, name, value, allow_equal=True)
    if low < 0.0 or high > 1.0:
        raise ConfigError(f"{where}: {name} must be (a, b) with 0 <= a <= b <= 1; got {tuple(value)}.")
    return low, high


class _Split:
    """Time steps of one split: target times and the grid times ``time_offset_hours`` earlier, ``[T]`` each."""

    def __init__(self, name: str, target_time: np.ndarray, grid_time: np.ndarray) -> None:
        self.name, self.target_time, self.grid_time = name, target_time, grid_time


class StationReanalysisTask:
    """Draws batches of station + reanalysis tasks; see ``StationReanalysisDataModule`` for the task."""

    def __init__(
        self,
        cache: ChunkCache,
        grid_variables: Sequence[str],
        station_variable: str,
        stats: dict[str, tuple[float, float]],
        grid_x: np.ndarray,
        station_x: np.ndarray,
        station_index: np.ndarray,
        coarsen: int,
        context_fraction: tuple[float, float],
        target: str,
    ) -> None:
        self.cache, self.grid_variables, self.station_variable = cache, list(grid_variables), station_variable
        self.mean = np.array([stats[v][0] for v in self.grid_variables], dtype=np.float32)
        self.std = np.array([stats[v][1] for v in self.grid_variables], dtype=np.float32)
        self.station_mean, self.station_std = (np.float32(s) for s in stats[station_variable])
        self.grid_x = torch.from_numpy(grid_x.astype(np.float32))  # [G, 2] coarse cell centres (lat, lon)
        self.station_x = station_x.astype(np.float32)  # [S, 2]
        self.station_index = station_index  # [2, S] (lat, lon) index of each station's grid point
        self.coarsen, self.context_fraction, self.target = max(int(coarsen), 1), context_fraction, target

    @property
    def num_stations(self) -> int:
        return self.station_x.shape[0]

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator,
        split: _Split,
        pick: np.ndarray | None = None,
        share: float | None = None,
        target_x: np.ndarray | None = None,
    ) -> Batch:
        """``batch_size`` tasks at random hours of ``split``: context ``grid [B, G, Dy]`` and ``stations``, targets.

        For predictions: ``pick [B]`` fixes the hours (indices into the split), ``share`` the stations' context
        share, and ``target_x [P, 2]`` replaces the station targets by those points (values unknown: ``y = 0``);
        with ``share`` and no ``target_x`` every station is a target, and ``extras["is_context"] [B, S]`` says
        which were in the context.
        """
        b, s = batch_size, self.num_stations
        if pick is None:
            pick = torch.randint(len(split.target_time), (b,), generator=generator).numpy()
        low, high = self.context_fraction if share is None else (share, share)
        share_b = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64)
        n_ctx = np.minimum(np.floor(share_b.numpy() * s).astype(np.int64), s - 1)  # at least one target
        perm = torch.argsort(torch.rand(b, s, generator=generator), dim=1).numpy()  # [B, S] random station order

        t_target, t_grid = split.target_time[pick], split.grid_time[pick]
        requests = [(v, t_grid) for v in self.grid_variables] + [(self.station_variable, t_target)]
        baseline_in_grid = self.station_variable in self.grid_variables
        if not baseline_in_grid:
            requests.append((self.station_variable, t_grid))
        fields = self.cache.read(requests)
        coarse = coarsen_fields(np.stack(fields[: len(self.grid_variables)], axis=1), self.coarsen)  # [B, V, h, w]
        coarse_station = (
            coarse[:, self.grid_variables.index(self.station_variable)]
            if baseline_in_grid
            else coarsen_fields(fields[-1], self.coarsen)
        )  # [B, h, w], the station variable on the coarse grid at the grid time

        # On-the-grid context: every coarse cell, normalised; cells with a NaN in any variable are masked out.
        y_grid = (coarse.reshape(b, coarse.shape[1], -1).transpose(0, 2, 1) - self.mean) / self.std  # [B, G, V]
        grid_ok = np.isfinite(y_grid).all(-1)
        lat_i, lon_i = self.station_index
        rows = np.arange(b)[:, None]
        station_y = (fields[len(self.grid_variables)][rows, lat_i, lon_i] - self.station_mean) / self.station_std
        station_ok = np.isfinite(station_y)  # [B, S]
        baseline = (coarse_station[rows, lat_i // self.coarsen, lon_i // self.coarsen] - self.station_mean) / (
            self.station_std
        )

        # Off-the-grid context: the first n_ctx stations of each task's order; targets: the rest (or all).
        width_c = max(int(n_ctx.max()), 1)
        idx_c = perm[:, :width_c]
        mask_c = (np.arange(width_c) < n_ctx[:, None]) & np.take_along_axis(station_ok, idx_c, 1)
        if self.target == "held_out" and share is None:
            width_t = s - int(n_ctx.min())
            pos = n_ctx[:, None] + np.arange(width_t)
            idx_t = np.take_along_axis(perm, np.minimum(pos, s - 1), 1)
            mask_t = pos < s
        else:
            idx_t = np.broadcast_to(np.arange(s), (b, s))
            mask_t = np.ones((b, s), dtype=bool)
        mask_t = mask_t & np.take_along_axis(station_ok, idx_t, 1)

        y_t = np.take_along_axis(station_y, idx_t, 1)
        err = np.where(mask_t, np.take_along_axis(baseline, idx_t, 1) - y_t, np.nan) ** 2
        num_targets = mask_t.sum(1)
        with np.errstate(invalid="ignore"):
            coarse_sq_err = np.where(num_targets > 0, np.nanmean(np.where(mask_t, err, np.nan), axis=1), 0.0)
        context = {
            "grid": _observations(self.grid_x.expand(b, -1, -1), y_grid, grid_ok, "context['grid']"),
            "stations": _observations(
                torch.from_numpy(self.station_x[idx_c]),
                np.take_along_axis(station_y, idx_c, 1)[..., None],
                mask_c,
                "context['stations']",
            ),
        }
        extras = {
            "target_scale": torch.full((b,), float(self.station_std)),
            "hour": torch.from_numpy(t_target.astype(np.int64)),
        }
        if target_x is not None:
            p = len(target_x)
            x_t = torch.from_numpy(np.ascontiguousarray(target_x, dtype=np.float32)).expand(b, p, 2)
            target = _observations(x_t, np.zeros((b, p, 1), np.float32), np.ones((b, p), bool), "target")
            return Batch(context, target, extras)
        target = _observations(torch.from_numpy(self.station_x[idx_t]), y_t[..., None], mask_t, "target")
        extras["coarse_sq_err"] = torch.from_numpy(np.nan_to_num(coarse_sq_err).astype(np.float32))
        extras["num_targets"] = torch.from_numpy(num_targets.astype(np.float32))
        if share is not None:
            is_context = np.zeros((b, s), dtype=bool)
            np.put_along_axis(is_context, idx_c, mask_c, axis=1)
            extras["is_context"] = torch.from_numpy(is_context)
        return Batch(context, target, extras)


def _observations(x: torch.Tensor, y: np.ndarray, mask: np.ndarray, name: str) -> Observations:
    """Observations with masked values zeroed, so that no NaN ever reaches a tensor: ``y [B, N, Dy]``."""
    y = np.where(mask[..., None], y, 0.0).astype(np.float32)
    return Observations(x.contiguous(), torch.from_numpy(y), torch.from_numpy(np.ascontiguousarray(mask)), name)


class _SplitTask:
    """The ``Task`` interface (``sample(batch_size, generator)``) of one split, for the shared task streams."""

    def __init__(self, task: StationReanalysisTask, split: _Split) -> None:
        self.task, self.split = task, split

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.task.sample(batch_size, generator, self.split)


class _PredictSet(Dataset):
    """Prediction batches of a ``StationReanalysisDataModule``: consecutive hours of its ``predict_split``."""

    def __init__(self, dm: StationReanalysisDataModule) -> None:
        self.task, self.split = dm.task, dm.splits[dm.predict_split]
        self.batch_size, self.seed, self.share = dm.batch_size, dm.seed, dm.predict_context_fraction
        points = dm.predict_points()
        self.target_x = None
        if points is not None:
            lat, lon = np.meshgrid(*points, indexing="ij")
            self.target_x = np.stack([lat.ravel(), lon.ravel()], -1)  # [H * W, 2]

    def __len__(self) -> int:
        return -(-len(self.split.target_time) // self.batch_size)

    def __getitem__(self, index: int) -> Batch:
        pick = np.arange(index * self.batch_size, min((index + 1) * self.batch_size, len(self.split.target_time)))
        generator = generator_from(self.seed, "predict", int(index))
        return self.task.sample(len(pick), generator, self.split, pick, self.share, self.target_x)


def default_cache_dir() -> Path:
    """Where the embedded sample is prepared: ``$GRIDTNP_CACHE`` or ``~/.cache/gridtnp``."""
    return Path(os.environ.get("GRIDTNP_CACHE") or Path.home() / ".cache" / "gridtnp")


class ERA5DataModule(TaskDataModule):
    """What the ERA5 DataModules share: a prepared store (or the embedded sample), date splits and loaders.

    ``store=None`` prepares the embedded ERA5 sample once into ``$GRIDTNP_CACHE`` (default ``~/.cache/gridtnp``)
    with statistics over ``train_dates``, and reuses it.
    """

    def __init__(
        self,
        store: str | None,
        dates: dict[str, tuple[str, str]],
        batch_size: int,
        train_batches: int,
        val_batches: int,
        test_batches: int,
        seed: int,
        num_workers: int,
        storage_options: dict[str, Any] | None = None,
        convert_layout: bool = False,
        stats: dict[str, Sequence[float]] | None = None,
    ) -> None:
        super().__init__(batch_size, train_batches, val_batches, test_batches, seed, num_workers)
        self.store, self.storage_options = store, storage_options
        self.convert_layout, self.stats = convert_layout, dict(stats or {})
        self.dates = {split: tuple(pair) for split, pair in dates.items()}

    def store_path(self) -> str:
        """The store this module reads: ``store``, or the embedded sample's cache path."""
        if self.store is not None:
            return str(self.store)
        train = self.dates["train"]
        suffix = "" if train == SAMPLE_TRAIN_DATES else f"_train-{train[0]}_{train[1]}"
        return str(default_cache_dir() / f"{SAMPLE_CACHE_NAME}{suffix}.zarr")

    def prepare_data(self) -> None:
        """Prepare the embedded sample into the cache once (statistics over ``train_dates``), unless ``store``."""
        if self.store is not None:
            return
        from gridtnp.data.prepare import prepare
        from gridtnp.data.sample import ERA5_SAMPLE, sample_path

        out = Path(self.store_path())
        if out.exists():
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            prepare([sample_path(ERA5_SAMPLE)], out, None, *self.dates["train"], progress=False)
        except DataError:
            if not out.exists():  # another process finished first otherwise
                raise

    def open(self, variables: Sequence[str]) -> xr.Dataset:
        """The store (prepared first if it is the sample), lazily, with ``variables`` only."""
        self.prepare_data()
        return open_store(self.store_path(), variables, self.storage_options, self.convert_layout)

    def chunk_cache(self, variables: Sequence[str], region: dict[str, slice] | None = None) -> ChunkCache:
        """A per-process chunk cache on the store for ``variables`` (``cache_chunks`` chunks per variable)."""
        capacity = self.cache_chunks * len(variables)
        return ChunkCache(self.store_path(), capacity, self.storage_options, variables, region, self.convert_layout)

    def split_hours(self, ds: xr.Dataset, path: str) -> dict[str, np.ndarray]:
        """Indices into ``ds.time`` of each split's hours ``{split: [T]}``; errors name the split and the store."""
        time = ds.indexes["time"]
        hours = {}
        for name, (start, end) in self.dates.items():
            try:
                selected = select_time(ds, start, end).indexes["time"]
            except DataError as err:
                raise DataError(f"{name}_dates ({start}, {end}) with store {path}: {err}") from err
            hours[name] = np.arange(len(time))[time.isin(selected)]
        names = list(hours)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                shared = np.intersect1d(hours[a], hours[b])
                if shared.size:
                    first = pd.Timestamp(time[shared[0]]).isoformat()
                    raise DataError(
                        f"The {a} and {b} dates overlap ({shared.size} hours, from {first}); "
                        "choose disjoint date ranges."
                    )
        return hours


@register("datamodule", "era5_stations")
class StationReanalysisDataModule(ERA5DataModule):
    """Station + reanalysis tasks (gridded TNP paper's t2m experiment): coarse ERA5 on the grid plus some stations
    as context, the other stations as targets.

    Each task is one random hour of the split. Context ``"grid"``: every grid variable at ``time_offset_hours``
    before that hour, averaged over ``coarsen x coarsen`` blocks (NaN-aware), at the blocks' centres
    ``x = (lat, lon)`` in degrees, ``y [B, G, len(grid_variables)]``. Context ``"stations"``: a share
    ``~ U[context_fraction]`` of the distinct stations inside the store's box, ``y`` = ``station_variable`` at the
    station's nearest grid point (values from ERA5, as in the paper), ``x`` = the station's own coordinates
    from the CSV. Targets: the other stations (``held_out``) or all. Values are normalised with the store's
    training-period statistics; NaNs are masked out (and zeroed). Stations snapping to a grid point that an earlier
    station already has are dropped (``unique_grid_points``), so no target shares its value with a context station.

    ``extras`` per task: ``target_scale`` (the station variable's std: metrics in physical units),
    ``coarse_sq_err`` (mean squared normalised error of predicting each target by the coarse cell of the station
    variable containing it, at the grid time), ``num_targets`` and ``hour`` (index into the store's time axis).

    Args:
        store: a prepared Zarr store (path or URL); None prepares the embedded ERA5 sample once into
            ``$GRIDTNP_CACHE`` (default ``~/.cache/gridtnp``) and reuses it.
        stations: a CSV of station locations (``latitude``, ``longitude``); None uses the embedded HadISD list.
        station_variable: the variable observed at the stations (context and targets).
        grid_variables: the variables of the on-the-grid context.
        coarsen: block size of the on-the-grid context (4: 0.25 -> 1 degree); 1 keeps the store's resolution.
        context_fraction: ``(a, b)``: each task uses a share ``~ U[a, b]`` of the stations as context
            (the paper's U[0, 0.3]).
        target: ``"held_out"`` (stations not in the context) or ``"all"``.
        train_dates, val_dates, test_dates: inclusive ``(start, end)`` date strings of each split.
        time_offset_hours: the grid context is from this many hours before the target hour (nowcasting).
        batch_size: tasks per batch.
        train_batches: batches per training epoch (per rank).
        val_batches, test_batches: batches in the fixed validation / test sets.
        seed: base seed of every split.
        num_workers: DataLoader workers (each opens its own handle on the store).
        cache_chunks: time chunks per variable kept in memory in each process.
        storage_options: fsspec options for a remote store, e.g. ``{"token": "anon"}``.
        convert_layout: accept a store that was not prepared by gridtnp (e.g. the public ARCO ERA5 store:
            latitudes descending, longitudes 0-360, other coordinate names) and convert it lazily on read.
        stats: ``{variable: [mean, std]}`` (``"u@850"`` for one level) used instead of the store's statistics,
            required for stores without them.
        predict_split: the split whose hours ``gridtnp predict`` covers, every hour in order.
        predict_context_fraction: the stations' context share for predictions (default: the middle of
            ``context_fraction``), drawn with a fixed seed.
        predict_resolution: predict on a regular lat/lon grid of this spacing (degrees) over the store's box
            instead of at the stations.
        unique_grid_points: keep one station per grid point (the first in the file). Two stations on one grid point
            have the same value, so one in the context would give the other away as a target; the embedded HadISD
            list has 9,159 distinct 0.25 degree points among its 9,957 stations.
    """

    def __init__(
        self,
        store: str | None = None,
        stations: str | None = None,
        station_variable: str = "t2m",
        grid_variables: Sequence[str] = ("t2m",),
        coarsen: int = 4,
        context_fraction: tuple[float, float] = (0.0, 0.3),
        target: Literal["held_out", "all"] = "held_out",
        train_dates: tuple[str, str] = SAMPLE_TRAIN_DATES,
        val_dates: tuple[str, str] = ("2019-03-22", "2019-03-26"),
        test_dates: tuple[str, str] = ("2019-03-27", "2019-03-31"),
        time_offset_hours: int = 0,
        batch_size: int = 16,
        train_batches: int = 100,
        val_batches: int = 16,
        test_batches: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        cache_chunks: int = 8,
        storage_options: dict[str, Any] | None = None,
        convert_layout: bool = False,
        stats: dict[str, Sequence[float]] | None = None,
        unique_grid_points: bool = True,
        predict_split: Literal["train", "val", "test"] = "test",
        predict_context_fraction: float | None = None,
        predict_resolution: float | None = None,
    ) -> None:
        dates = {"train": train_dates, "val": val_dates, "test": test_dates}
        super().__init__(
            store,
            dates,
            batch_size,
            train_batches,
            val_batches,
            test_batches,
            seed,
            num_workers,
            storage_options=storage_options,
            convert_layout=convert_layout,
            stats=stats,
        )
        where = "StationReanalysisDataModule"
        check_counts(
            where,
            [("coarsen", coarsen, 1), ("time_offset_hours", time_offset_hours, 0), ("cache_chunks", cache_chunks, 1)],
        )
        if target not in ("held_out", "all"):
            raise ConfigError(f"{where}: target must be 'held_out' or 'all'; got {target!r}.")
        if isinstance(grid_variables, str) or not grid_variables:
            raise ConfigError(f"{where}: grid_variables must be a non-empty list of names; got {grid_variables!r}.")
        self.save_hyperparameters()
        self.stations = stations
        self.station_variable, self.grid_variables = station_variable, list(grid_variables)
        self.coarsen, self.target = coarsen, target
        self.context_fraction = check_fraction_range(where, "context_fraction", context_fraction)
        self.time_offset_hours = time_offset_hours
        self.cache_chunks, self.unique_grid_points = cache_chunks, unique_grid_points
        if predict_context_fraction is not None and not 0.0 <= predict_context_fraction <= 1.0:
            raise ConfigError(f"{where}: predict_context_fraction must be in [0, 1]; got {predict_context_fraction}.")
        if predict_resolution is not None and predict_resolution <= 0:
            raise ConfigError(
                f"{where}: predict_resolution must be a positive spacing in degrees; got {predict_resolution}."
            )
        self.predict_split, self.predict_resolution = predict_split, predict_resolution
        self.predict_context_fraction = (
            sum(self.context_fraction) / 2 if predict_context_fraction is None else float(predict_context_fraction)
        )
        self.task: StationReanalysisTask | None = None
        self.splits: dict[str, _Split] = {}

    dim_x = 2
    geographic = True  # x = (latitude, longitude) in degrees: plots draw maps

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source."""
        return {"grid": len(self.grid_variables), "stations": 1}

    target_dim_y = 1

    def setup(self, stage: str | None = None) -> None:
        """Open the store for metadata, check variables, dates and stations, and build the task sampler."""
        if self.task is not None:
            return
        from gridtnp.data.sample import STATIONS_SAMPLE, sample_path
        from gridtnp.data.stations import read_stations

        path = self.store_path()
        variables = list(dict.fromkeys([*self.grid_variables, self.station_variable]))
        ds = self.open(variables)
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
            raise DataError(
                f"{station_file}: {int(keep.sum())} distinct station(s) inside the store {path}, which covers "
                f"{coverage(ds)}; need at least 2 (context and targets). Use a station file for this region."
            )
        kept = table[keep]
        self.station_table = kept.reset_index(drop=True)
        self.time_axis, self.box = ds.indexes["time"], (lat, lon)
        self.units = str(ds[self.station_variable].attrs.get("units", ""))
        self.long_name = str(ds[self.station_variable].attrs.get("long_name", self.station_variable))
        station_x = kept[["latitude", "longitude"]].to_numpy(np.float64)
        station_index = np.stack([kept["lat_index"].to_numpy(np.int64), kept["lon_index"].to_numpy(np.int64)])

        time = ds.indexes["time"]
        self.splits = {}
        for name, target_time in self.split_hours(ds, path).items():
            grid_time = time.get_indexer(time[target_time] - pd.Timedelta(hours=self.time_offset_hours))
            ok = grid_time >= 0
            if not ok.any():
                start, end = self.dates[name]
                raise DataError(
                    f"{path}: no {name} hour from {start} to {end} has grid data {self.time_offset_hours} h earlier; "
                    f"the store covers {coverage(ds)}."
                )
            self.splits[name] = _Split(name, target_time[ok], grid_time[ok])

        c = self.coarsen
        hc, wc = -(-len(lat) // c), -(-len(lon) // c)
        lat_c = coarsen_fields(np.broadcast_to(lat[:, None], (len(lat), len(lon))).astype(np.float32), c)
        lon_c = coarsen_fields(np.broadcast_to(lon[None, :], (len(lat), len(lon))).astype(np.float32), c)
        grid_x = np.stack([lat_c, lon_c], -1).reshape(hc * wc, 2)
        cache = self.chunk_cache(variables)
        self.task = StationReanalysisTask(
            cache,
            self.grid_variables,
            self.station_variable,
            stats,
            grid_x,
            station_x,
            station_index,
            c,
            self.context_fraction,
            self.target,
        )

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
        return DataLoader(_PredictSet(self), shuffle=False, **self._loader_kwargs())

    def predictions_to_xarray(self, outputs: Sequence[dict[str, torch.Tensor]]) -> xr.Dataset:
        """``gridtnp predict`` outputs -> ``mean``, ``std`` in physical units on ``(time, station)`` with station
        coordinates (and ``observed``, ``is_context``), or on ``(time, latitude, longitude)``."""
        mean = torch.cat([o["mean"][..., 0] for o in outputs]).double().numpy() * self.task.station_std
        mean += self.task.station_mean
        std = torch.cat([o["std"][..., 0] for o in outputs]).double().numpy() * self.task.station_std
        time = self.time_axis[torch.cat([o["hour"] for o in outputs]).numpy()]
        attrs = {"units": self.units}
        name = self.long_name
        points = self.predict_points()
        if points is not None:
            lat, lon = points
            shape = (len(time), len(lat), len(lon))
            dims, coords = ("time", "latitude", "longitude"), {"time": time, "latitude": lat, "longitude": lon}
            data = {"mean": (dims, mean.reshape(shape)), "std": (dims, std.reshape(shape))}
        else:
            table = self.station_table
            dims = ("time", "station")
            coords = {
                "time": time,
                "station": np.arange(len(table)),
                "latitude": ("station", table["latitude"].to_numpy(np.float64)),
                "longitude": ("station", table["longitude"].to_numpy(np.float64)),
            }
            if "station_id" in table:
                coords["station_id"] = ("station", table["station_id"].astype(str).to_numpy())
            observed = torch.cat([o["y"][..., 0] for o in outputs]).double().numpy() * self.task.station_std
            observed += self.task.station_mean
            valid = torch.cat([o["mask"] for o in outputs]).numpy()
            data = {
                "mean": (dims, mean),
                "std": (dims, std),
                "observed": (
                    dims,
                    np.where(valid, observed, np.nan),
                    {**attrs, "long_name": f"{name} (ERA5 at the station)"},
                ),
                "is_context": (
                    dims,
                    torch.cat([o["is_context"] for o in outputs]).numpy().astype(np.int8),
                    {"long_name": "station was in the context set", "flag_values": [0, 1]},
                ),
            }
        ds = xr.Dataset(data, coords=coords)
        ds["mean"].attrs = {**attrs, "long_name": f"predictive mean of {name}"}
        ds["std"].attrs = {**attrs, "long_name": f"predictive standard deviation of {name}"}
        ds["latitude"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
        ds["longitude"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
        ds.attrs.update(
            {
                "Conventions": "CF-1.8",
                "source": f"gridtnp predictions from the store {self.store_path()}",
                "predict_split": self.predict_split,
                "predict_context_fraction": self.predict_context_fraction,
            }
        )
        return ds

    def split_task(self, name: str) -> _SplitTask:
        """The task generator of split ``name``, reading only that split's hours."""
        self.setup()
        assert self.task is not None
        return _SplitTask(self.task, self.splits[name])


# --- Multi-source spatio-temporal tasks (gridded TNP paper, wind) -----------------------------------------------------


class Source:
    """One modality of a multi-source task: ``"u10"`` (a variable) or ``"u@850"`` (variable ``u`` at level 850).

    ``name`` is the context-source key (``"u850"`` for ``"u@850"``).
    """

    def __init__(self, spec: str) -> None:
        variable, _, level = str(spec).partition("@")
        if not variable or (level and not _is_number(level)):
            raise ConfigError(f"Variable {spec!r}: expected a name such as 'u10', or name@level such as 'u@850'.")
        self.spec, self.variable = str(spec), variable
        self.level = float(level) if level else None
        self.name = variable if self.level is None else f"{variable}{self.level:g}"

    def __repr__(self) -> str:
        return f"Source({self.spec!r})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class MultiSourceTask:
    """Draws batches of multi-source spatio-temporal tasks; see ``MultiSourceDataModule`` for the task."""

    def __init__(
        self,
        cache: ChunkCache,
        sources: Sequence[Source],
        level_index: dict[str, int],
        targets: Sequence[str],
        stats: dict[str, tuple[float, float]],
        x: np.ndarray,
        window: int,
        context_fraction: tuple[float, float],
        target_fraction: float,
    ) -> None:
        self.cache, self.sources, self.level_index = cache, list(sources), level_index
        self.targets = [s for s in self.sources if s.name in targets]  # context-source order
        self.mean = {s.name: np.float32(stats[s.name][0]) for s in self.sources}
        self.std = {s.name: np.float32(stats[s.name][1]) for s in self.sources}
        self.x = torch.from_numpy(x.astype(np.float32))  # [P, 3] (hour in window, lat, lon) of every point
        self.window, self.context_fraction, self.target_fraction = window, context_fraction, target_fraction

    def sample(self, batch_size: int, generator: torch.Generator, starts: np.ndarray, dense: bool = False) -> Batch:
        """``batch_size`` windows starting at random hours of ``starts``: one context source per variable, targets.

        ``dense`` (predictions): the windows start at ``starts`` in order (``len(starts) == batch_size``), the
        contexts are drawn from every point and every point of the window is a target.
        """
        b, p = batch_size, self.x.shape[0]
        random_starts = starts[torch.randint(len(starts), (b,), generator=generator).numpy()] if not dense else None
        pick = np.asarray(starts) if dense else random_starts  # [B] first hour of each window
        steps = (pick[:, None] + np.arange(self.window)).reshape(-1)  # [B * T]
        variables = list(dict.fromkeys(s.variable for s in self.sources))
        fields = dict(zip(variables, self.cache.read([(v, steps) for v in variables]), strict=True))

        values = {}  # normalised [B, P] per source, NaN where missing
        for s in self.sources:
            field = fields[s.variable]  # [B * T, (levels,) H, W]
            if s.name in self.level_index:
                field = field[:, self.level_index[s.name]]
            values[s.name] = (field.reshape(b, p) - self.mean[s.name]) / self.std[s.name]

        # Targets: a share `target_fraction` of the points, where every target variable is finite.
        n_t = max(round(self.target_fraction * p), 1)
        is_target = np.zeros((b, p), dtype=bool)
        if dense:
            n_t, idx_t = 0, np.broadcast_to(np.arange(p), (b, p))  # n_t = 0: contexts may use every point
        else:
            idx_t = torch.argsort(torch.rand(b, p, generator=generator), dim=1)[:, :n_t].numpy()  # [B, Nt]
            np.put_along_axis(is_target, idx_t, True, axis=1)
        y_t = np.stack([np.take_along_axis(values[s.name], idx_t, 1) for s in self.targets], -1)  # [B, Nt, Dy]
        mask_t = np.isfinite(y_t).all(-1)

        low, high = self.context_fraction
        context = {}
        for s in self.sources:
            share = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64).numpy()
            n_c = np.floor(share * p).astype(np.int64)  # [B]
            # A random order of the points, target points of a target variable last: its context never holds them.
            order = torch.rand(b, p, generator=generator).numpy()
            if s in self.targets:
                order = np.where(is_target, 2.0, order)
                n_c = np.minimum(n_c, p - n_t)
            width = max(int(n_c.max()), 1)
            idx_c = np.argsort(order, axis=1)[:, :width]  # [B, Nc]
            y_c = np.take_along_axis(values[s.name], idx_c, 1)[..., None]
            mask_c = (np.arange(width) < n_c[:, None]) & np.isfinite(y_c[..., 0])
            context[s.name] = _observations(self.x[torch.from_numpy(idx_c)], y_c, mask_c, f"context[{s.name!r}]")

        target = _observations(self.x[torch.from_numpy(idx_t)], y_t, mask_t, "target")
        extras = {"start_hour": torch.from_numpy(pick.astype(np.int64))}
        if len(self.targets) == 1:  # metrics in physical units need one scale per task
            extras["target_scale"] = torch.full((b,), float(self.std[self.targets[0].name]))
        return Batch(context, target, extras)


class _WindowTask:
    """The ``Task`` interface of one split of a ``MultiSourceTask``: windows starting at ``starts``."""

    def __init__(self, task: MultiSourceTask, starts: np.ndarray) -> None:
        self.task, self.starts = task, starts

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.task.sample(batch_size, generator, self.starts)


class _WindowPredictSet(Dataset):
    """Prediction batches of a ``MultiSourceDataModule``: non-overlapping windows of the test split, in order."""

    def __init__(self, dm: MultiSourceDataModule) -> None:
        self.task, self.batch_size, self.seed = dm.task, dm.batch_size, dm.seed
        starts = dm.starts["test"]
        chosen, next_free = [], -1
        for start in starts:  # greedy: the next window starts once the previous one has ended
            if start >= next_free:
                chosen.append(start)
                next_free = start + dm.window
        self.starts = np.asarray(chosen, dtype=np.int64)

    def __len__(self) -> int:
        return -(-len(self.starts) // self.batch_size)

    def __getitem__(self, index: int) -> Batch:
        starts = self.starts[index * self.batch_size : (index + 1) * self.batch_size]
        generator = generator_from(self.seed, "predict", int(index))
        return self.task.sample(len(starts), generator, starts, dense=True)


@register("datamodule", "era5_multisource")
class MultiSourceDataModule(ERA5DataModule):
    """Multi-source spatio-temporal tasks (gridded TNP paper's wind experiment): each variable / pressure level is
    its own context source over a lat/lon box and ``window`` consecutive hours.

    Every point of a task has ``x = (hour in the window, lat, lon)`` (``dim_x = 3``, hours ``0 .. window - 1``,
    degrees), so the model's grid can span ``[window, lat, lon]``. Context source ``name`` (``"u850"`` for
    ``"u@850"``): a share ``~ U[context_fraction]`` (drawn per task and source) of that variable's points,
    ``y [B, N, 1]``. Targets: a share ``target_fraction`` of the points, ``y [B, Nt, len(target_variables)]``;
    a target variable's context never contains the target points. Values are normalised with the store's
    training-period statistics (per level when the store has them); NaNs are masked out. ``extras``:
    ``start_hour`` (index into the store's time axis of each window's first hour) and, with one target
    variable, ``target_scale`` (its std, for metrics in physical units).

    Args:
        store: a prepared Zarr store (path or URL); None prepares the embedded ERA5 sample (t2m only).
        variables: the context sources, ``"name"`` or ``"name@level"`` (e.g. ``["u@700", "v@700", "u10"]``).
        target_variables: the variables predicted at the targets, in ``variables``' notation (default: all).
        region: ``(lat_min, lat_max, lon_min, lon_max)`` in degrees (default: the whole store).
        window: consecutive hours per task (T).
        context_fraction: ``(a, b)``: each source's context share per task ``~ U[a, b]`` (the paper's
            U[0.05, 0.25]).
        target_fraction: share of the points used as targets (the paper's 0.25).
        train_dates, val_dates, test_dates: inclusive ``(start, end)`` date strings of each split; a window lies
            wholly inside its split.
        batch_size, train_batches, val_batches, test_batches, seed, num_workers: as for every task DataModule.
        cache_chunks: time chunks per variable kept in memory in each process.
        storage_options: fsspec options for a remote store, e.g. ``{"token": "anon"}``.
        convert_layout: accept a store that was not prepared by gridtnp (e.g. the public ARCO ERA5 store:
            latitudes descending, longitudes 0-360, other coordinate names) and convert it lazily on read.
        stats: ``{variable: [mean, std]}`` (``"u@850"`` for one level) used instead of the store's statistics,
            required for stores without them.
    """

    def __init__(
        self,
        store: str | None = None,
        variables: Sequence[str] = ("t2m",),
        target_variables: Sequence[str] | None = None,
        region: tuple[float, float, float, float] | None = None,
        window: int = 4,
        context_fraction: tuple[float, float] = (0.05, 0.25),
        target_fraction: float = 0.25,
        train_dates: tuple[str, str] = SAMPLE_TRAIN_DATES,
        val_dates: tuple[str, str] = ("2019-03-22", "2019-03-26"),
        test_dates: tuple[str, str] = ("2019-03-27", "2019-03-31"),
        batch_size: int = 8,
        train_batches: int = 100,
        val_batches: int = 16,
        test_batches: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        cache_chunks: int = 8,
        storage_options: dict[str, Any] | None = None,
        convert_layout: bool = False,
        stats: dict[str, Sequence[float]] | None = None,
    ) -> None:
        dates = {"train": train_dates, "val": val_dates, "test": test_dates}
        super().__init__(
            store,
            dates,
            batch_size,
            train_batches,
            val_batches,
            test_batches,
            seed,
            num_workers,
            storage_options=storage_options,
            convert_layout=convert_layout,
            stats=stats,
        )
        where = "MultiSourceDataModule"
        check_counts(where, [("window", window, 1), ("cache_chunks", cache_chunks, 1)])
        if isinstance(variables, str) or not variables:
            raise ConfigError(
                f"{where}: variables must be a non-empty list such as ['u@700', 'v@700']; got {variables!r}."
            )
        self.sources = [Source(v) for v in variables]
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: variables {list(variables)} name a source twice.")
        targets = [Source(v).name for v in (variables if target_variables is None else target_variables)]
        unknown = [t for t in targets if t not in names]
        if unknown or not targets:
            raise ConfigError(
                f"{where}: target_variables {target_variables!r} must be a non-empty subset of variables {names}."
            )
        if not 0.0 < float(target_fraction) < 1.0:
            raise ConfigError(f"{where}: target_fraction must be in (0, 1); got {target_fraction}.")
        self.save_hyperparameters()
        self.targets, self.region, self.window = targets, region, window
        self.context_fraction = check_fraction_range(where, "context_fraction", context_fraction)
        self.target_fraction, self.cache_chunks = float(target_fraction), cache_chunks
        self.task: MultiSourceTask | None = None
        self.starts: dict[str, np.ndarray] = {}

    dim_x = 3

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source (one variable each)."""
        return {s.name: 1 for s in self.sources}

    @property
    def target_dim_y(self) -> int:
        """One output per target variable."""
        return len(self.targets)

    def setup(self, stage: str | None = None) -> None:
        """Open the store for metadata, check variables, levels, region and dates, and build the task sampler."""
        if self.task is not None:
            return
        path = self.store_path()
        variables = list(dict.fromkeys(s.variable for s in self.sources))
        ds = self.open(variables)
        box = select(ds, region=self.region) if self.region is not None else ds
        lat, lon = box["latitude"].values, box["longitude"].values
        region = {
            "latitude": _index_slice(ds["latitude"].values, lat),
            "longitude": _index_slice(ds["longitude"].values, lon),
        }
        level_index, stats = {}, {}
        for s in self.sources:
            var = ds[s.variable]
            extra = [d for d in var.dims if d not in DIMS]
            if len(extra) > 1 or var.dims[0] != "time" or var.dims[-2:] != DIMS[1:]:
                raise DataError(
                    f"{path}: variable {s.variable!r} has dims {var.dims}; expected {DIMS}, optionally "
                    "with one level dimension after time."
                )
            if extra and s.level is None:
                levels = ", ".join(f"{v:g}" for v in var[extra[0]].values)
                raise DataError(
                    f"{path}: variable {s.variable!r} has levels ({extra[0]}: {levels}); "
                    f"name one, e.g. '{s.variable}@{var[extra[0]].values[0]:g}'."
                )
            if not extra and s.level is not None:
                raise DataError(
                    f"{path}: variable {s.variable!r} has no level dimension; write {s.variable!r}, not {s.spec!r}."
                )
            if extra:
                levels = var[extra[0]].values
                found = np.flatnonzero(np.isclose(levels.astype(np.float64), s.level))
                if found.size == 0:
                    raise DataError(
                        f"{path}: variable {s.variable!r} has no level {s.level:g} "
                        f"({extra[0]}: {', '.join(f'{v:g}' for v in levels)})."
                    )
                level_index[s.name] = int(found[0])
            stats[s.name] = normalisation_stats(ds, s.variable, s.level, source=path, given=self.stats)

        time = ds.indexes["time"]
        self.starts = {}
        for name, hours in self.split_hours(ds, path).items():
            # A window starts at hour i when hours i .. i + T - 1 are all in the split and consecutive.
            span = self.window - 1
            if len(hours) > span:
                ok = (hours[span:] - hours[: -span or None] == span) if span else np.ones(len(hours), bool)
                ok &= (time[hours[span:]] - time[hours[: len(hours) - span]]) == pd.Timedelta(hours=span)
                starts = hours[: len(hours) - span][ok]
            else:
                starts = hours[:0]
            if starts.size == 0:
                start, end = self.dates[name]
                raise DataError(
                    f"{path}: {name} dates {start} to {end} hold no {self.window} consecutive hours "
                    f"(the store covers {coverage(ds)})."
                )
            self.starts[name] = starts

        self.time_axis, self.box = time, (lat, lon)
        self.units = {s.name: str(ds[s.variable].attrs.get("units", "")) for s in self.sources}
        t, la, lo = np.meshgrid(np.arange(self.window, dtype=np.float64), lat, lon, indexing="ij")
        x = np.stack([t, la, lo], -1).reshape(-1, 3)  # [T * H * W, 3], the order of a field's reshape
        cache = self.chunk_cache(variables, region)
        self.task = MultiSourceTask(
            cache,
            self.sources,
            level_index,
            self.targets,
            stats,
            x,
            self.window,
            self.context_fraction,
            self.target_fraction,
        )

    def predict_dataloader(self) -> DataLoader:
        """Consecutive, non-overlapping windows of the test split, ``batch_size`` a batch, predicted at every point."""
        self.setup()
        return DataLoader(_WindowPredictSet(self), shuffle=False, **self._loader_kwargs())

    def predictions_to_xarray(self, outputs: Sequence[dict[str, torch.Tensor]]) -> xr.Dataset:
        """``gridtnp predict`` outputs -> ``<variable>_mean``, ``<variable>_std`` on ``(time, latitude, longitude)``
        in physical units, one variable per target variable."""
        assert self.task is not None
        lat, lon = self.box
        shape = (-1, self.window, len(lat), len(lon))
        start = torch.cat([o["start_hour"] for o in outputs]).numpy()
        time = self.time_axis[(start[:, None] + np.arange(self.window)).reshape(-1)]
        mean = torch.cat([o["mean"] for o in outputs]).double().numpy()  # [windows, P, Dy]
        std = torch.cat([o["std"] for o in outputs]).double().numpy()
        dims = ("time", "latitude", "longitude")
        data = {}
        for j, source in enumerate(self.task.targets):
            scale, offset = float(self.task.std[source.name]), float(self.task.mean[source.name])
            units = {"units": self.units.get(source.name, "")}
            for kind, values in (("mean", mean[..., j] * scale + offset), ("std", std[..., j] * scale)):
                field = values.reshape(shape).reshape(-1, len(lat), len(lon))
                long_name = f"predictive {'mean' if kind == 'mean' else 'standard deviation'} of {source.spec}"
                data[f"{source.name}_{kind}"] = (dims, field, {**units, "long_name": long_name})
        ds = xr.Dataset(data, coords={"time": time, "latitude": lat, "longitude": lon})
        ds["latitude"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
        ds["longitude"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
        ds.attrs.update(
            {
                "Conventions": "CF-1.8",
                "source": f"gridtnp predictions from the store {self.store_path()}",
                "context": ", ".join(s.spec for s in self.sources),
                "context_fraction": list(self.context_fraction),
            }
        )
        return ds

    def split_task(self, name: str) -> _WindowTask:
        """The task generator of split ``name``: windows wholly inside that split."""
        self.setup()
        assert self.task is not None
        return _WindowTask(self.task, self.starts[name])


def _index_slice(axis: np.ndarray, selected: np.ndarray) -> slice:
    """The index slice of ``axis`` holding the (contiguous) ``selected`` values."""
    first = int(np.searchsorted(axis, selected[0]))
    return slice(first, first + len(selected))
