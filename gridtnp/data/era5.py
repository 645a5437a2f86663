"""Open prepared ERA5 Zarr stores lazily and select a date range and region, with errors a user can act on.

A prepared store (``gridtnp data prepare``) holds variables ``[time, ..., latitude, longitude]`` with latitudes
ascending, longitudes ascending in [-180, 180), ``time`` as datetime64, and per-variable normalisation statistics
in ``attrs["gridtnp_stats"]``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import xarray as xr

from gridtnp.data.batch import Batch, Observations
from gridtnp.data.datamodules import TaskDataModule, check_counts
from gridtnp.registry import ConfigError, register

STATS_ATTR = "gridtnp_stats"
PROVENANCE_ATTR = "gridtnp_provenance"
DIMS = ("time", "latitude", "longitude")

DateLike = str | np.datetime64 | pd.Timestamp

_PREPARE_HINT = "Run `gridtnp data prepare SOURCE --out STORE.zarr` to write a store in gridtnp's layout."

# fsspec protocol -> the package that implements it, for a helpful message when it is missing.
_PROTOCOL_PACKAGES = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "s3": "s3fs",
    "az": "adlfs",
    "abfs": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
}


class DataError(ConfigError):
    """Input data that cannot be used as given; the message names the file or variable and what was expected."""


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a remote URL (``gs://``, ``s3://``, ``https://``, ...) rather than a local path."""
    return "://" in str(path)


def open_store(
    path_or_url: str | os.PathLike[str],
    variables: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> xr.Dataset:
    """Open a prepared Zarr store lazily (dask, the store's own chunks) and check its layout.

    ``path_or_url`` is a local path or a URL (``gs://...`` needs gcsfs; pass ``storage_options={"token": "anon"}``
    for public buckets). ``variables`` keeps only those data variables; each is ``[time, ..., latitude, longitude]``.
    """
    source = str(path_or_url)
    if not is_url(source) and not os.path.exists(source):
        raise DataError(f"No Zarr store at {source!r}. {_PREPARE_HINT}")
    try:
        ds = xr.open_zarr(source, chunks={}, storage_options=storage_options)
    except ImportError as err:
        protocol = source.split("://", 1)[0]
        package = _PROTOCOL_PACKAGES.get(protocol, f"the fsspec implementation for {protocol}://")
        raise DataError(f"Opening {source!r} needs {package}: pip install {package} ({err}).") from err
    except FileNotFoundError as err:
        raise DataError(f"No Zarr store at {source!r} ({err}). {_PREPARE_HINT}") from err
    except Exception as err:
        raise DataError(f"{source!r} could not be opened as a Zarr store ({type(err).__name__}: {err}).") from err
    if variables is not None:
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise DataError(
                f"{source!r} has no variable(s) {', '.join(map(repr, missing))}; "
                f"available: {', '.join(map(str, ds.data_vars)) or '(none)'}."
            )
        ds = ds[list(variables)]
    check_layout(ds, source)
    return ds


def check_layout(ds: xr.Dataset, source: str = "dataset") -> None:
    """Raise ``DataError`` unless ``ds`` is in the prepared layout (see the module docstring)."""
    missing = [d for d in DIMS if d not in ds.coords]
    if missing:
        raise DataError(
            f"{source}: no {', '.join(missing)} coordinate (found: {', '.join(map(str, ds.coords)) or 'none'}); "
            f"gridtnp expects coordinates named {', '.join(DIMS)}. {_PREPARE_HINT}"
        )
    if not np.issubdtype(ds["time"].dtype, np.datetime64):
        raise DataError(f"{source}: time has dtype {ds['time'].dtype}, expected datetime64. {_PREPARE_HINT}")
    lat = ds["latitude"].values
    lon = ds["longitude"].values
    if lat.size > 1 and not np.all(np.diff(lat) > 0):
        order = "descending" if np.all(np.diff(lat) < 0) else "not sorted"
        raise DataError(f"{source}: latitudes are {order} ({lat[0]} to {lat[-1]}); expected ascending. {_PREPARE_HINT}")
    if lon.size and (lon.min() < -180 or lon.max() >= 180):
        raise DataError(
            f"{source}: longitudes span {lon.min()} to {lon.max()}; expected [-180, 180) "
            f"(a 0-360 store must be converted). {_PREPARE_HINT}"
        )
    if lon.size > 1 and not np.all(np.diff(lon) > 0):
        raise DataError(f"{source}: longitudes are not ascending; expected ascending in [-180, 180). {_PREPARE_HINT}")
    for name, var in ds.data_vars.items():
        absent = [d for d in DIMS if d not in var.dims]
        if absent:
            raise DataError(f"{source}: variable {name!r} has dims {var.dims}; expected it to include {DIMS}.")


def coverage(ds: xr.Dataset) -> str:
    """What ``ds`` covers, for error messages: time range and steps, latitude and longitude ranges."""
    time = ds.indexes["time"]
    lat, lon = ds["latitude"].values, ds["longitude"].values
    return (
        f"time {_iso(time[0])} to {_iso(time[-1])} ({len(time)} steps), "
        f"latitude {lat.min():g} to {lat.max():g}, longitude {lon.min():g} to {lon.max():g}"
    )


def select(
    ds: xr.Dataset,
    start: DateLike | None = None,
    end: DateLike | None = None,
    region: tuple[float, float, float, float] | None = None,
) -> xr.Dataset:
    """Lazy subset of a prepared ``ds``: times in [start, end] and ``region=(lat_min, lat_max, lon_min, lon_max)``.

    Bounds are inclusive; a date ``"2019-03-21"`` as ``end`` includes that whole day. A range or region reaching
    outside the store is an error naming the store's coverage (no silent clipping).
    """
    out = select_time(ds, start, end)
    if region is None:
        return out
    lat_min, lat_max, lon_min, lon_max = map(float, region)
    if lat_min > lat_max or lon_min > lon_max:
        raise DataError(
            f"Region {tuple(region)} must be (lat_min, lat_max, lon_min, lon_max) with min <= max "
            "(longitudes in [-180, 180); regions crossing the antimeridian are not supported)."
        )
    lat, lon = ds["latitude"].values, ds["longitude"].values
    if lat_min < lat.min() or lat_max > lat.max() or lon_min < lon.min() or lon_max > lon.max():
        raise DataError(
            f"Region lat {lat_min:g} to {lat_max:g}, lon {lon_min:g} to {lon_max:g} reaches outside the store, "
            f"which covers {coverage(ds)}."
        )
    out = out.sel(latitude=slice(lat_min, lat_max), longitude=slice(lon_min, lon_max))
    if out.sizes["latitude"] == 0 or out.sizes["longitude"] == 0:
        raise DataError(
            f"Region lat {lat_min:g} to {lat_max:g}, lon {lon_min:g} to {lon_max:g} contains no grid point "
            f"(grid steps {_step(lat):g} x {_step(lon):g} degrees)."
        )
    return out


def normalisation_stats(ds: xr.Dataset, variable: str) -> tuple[float, float]:
    """``(mean, std)`` of ``variable`` over the training period, as written by ``gridtnp data prepare``."""
    stats = ds.attrs.get(STATS_ATTR, {})
    if variable not in stats:
        raise DataError(
            f"No normalisation statistics for {variable!r} in the store's attrs[{STATS_ATTR!r}] "
            f"(have: {', '.join(stats) or 'none'}). {_PREPARE_HINT}"
        )
    return float(stats[variable]["mean"]), float(stats[variable]["std"])


def select_time(ds: xr.Dataset, start: DateLike | None = None, end: DateLike | None = None) -> xr.Dataset:
    """Lazy subset of ``ds`` with times in [start, end], inclusive at each string's resolution; errors as ``select``."""
    time = ds.indexes["time"]
    first, last = time[0], time[-1]
    (s0, s1) = (first, first) if start is None else date_bounds(start, "start")
    (e0, e1) = (last, last) if end is None else date_bounds(end, "end")
    # Outside = a requested start (end) period wholly before (after) the store, or the range missing it entirely.
    if s1 < first or e0 > last or s0 > last or e1 < first:
        raise DataError(
            f"Dates {_describe_range(start, end)} reach outside the store, which covers {coverage(ds)}. "
            "Choose dates inside that range, or prepare a store that covers them."
        )
    if s0 > e1:
        raise DataError(f"Dates: start {start} is after end {end}; expected start <= end.")
    out = ds.sel(time=slice(s0, e1))
    if out.sizes["time"] == 0:
        raise DataError(f"No time steps {_describe_range(start, end)}; the store covers {coverage(ds)}.")
    return out


def date_bounds(value: DateLike, what: str = "date") -> tuple[pd.Timestamp, pd.Timestamp]:
    """First and last instant a date covers: ``"2019-03-21"`` is that whole day, a timestamp is itself."""
    try:
        if isinstance(value, str):
            period = pd.Period(value)
            return period.start_time, period.end_time
        t = pd.Timestamp(value)
    except (ValueError, TypeError) as err:
        raise DataError(f"{what} {value!r} is not a date; expected e.g. '2019-03-21' or '2019-03-21T06'.") from err
    return t, t


def _describe_range(start: DateLike | None, end: DateLike | None) -> str:
    if start is None:
        return f"up to {end}"
    return f"from {start}" if end is None else f"{start} to {end}"


def _iso(t: Any) -> str:
    return pd.Timestamp(t).isoformat()


def _step(axis: np.ndarray) -> float:
    return float(np.median(np.diff(axis))) if axis.size > 1 else float("nan")


# --- Station + reanalysis tasks (gridded TNP paper, t2m at weather stations) ------------------------------------------
#
# Imported lazily by ``gridtnp.data`` (``StationReanalysisDataModule``) so that ``import gridtnp`` does not load
# xarray; everything below reuses the checks above.

SAMPLE_CACHE_NAME = "era5_t2m_uk_2019-03"
SAMPLE_TRAIN_DATES = ("2019-03-01", "2019-03-21")


class ChunkCache:
    """Whole time chunks ``[steps, H, W]`` of a lazily opened store, kept in an LRU per process.

    The store is opened on first use in each process (a DataLoader worker opens its own handle) and the handle
    and cached arrays are dropped when pickled. ``reads`` counts chunks read from the store, ``hits`` requests
    served from memory, ``loaded`` lists the ``(variable, chunk)`` pairs read, for tests and benchmarks.
    """

    def __init__(
        self, store: str, capacity: int, storage_options: dict[str, Any] | None = None, variables: Sequence[str] = ()
    ) -> None:
        self.store, self.capacity, self.storage_options = store, capacity, storage_options
        self.variables = list(variables)
        self._ds: xr.Dataset | None = None
        self._pid: int | None = None
        self._bounds: dict[str, np.ndarray] = {}
        self._lru: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self.reads, self.hits, self.loaded = 0, 0, []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_ds=None, _pid=None, _bounds={}, _lru=OrderedDict(), reads=0, hits=0, loaded=[])
        return state

    def dataset(self) -> xr.Dataset:
        """This process's handle on the store, opened on first use."""
        if self._ds is None or self._pid != os.getpid():
            self._ds = open_store(self.store, self.variables or None, self.storage_options)
            self._pid, self._lru, self._bounds = os.getpid(), OrderedDict(), {}
        return self._ds

    def bounds(self, variable: str) -> np.ndarray:
        """Chunk boundaries along time ``[C + 1]`` of ``variable``: chunk ``c`` holds steps ``[b[c], b[c + 1])``."""
        if variable not in self._bounds:
            steps = self.dataset()[variable].data.chunks[0]
            self._bounds[variable] = np.concatenate([[0], np.cumsum(steps)])
        return self._bounds[variable]

    def read(self, requests: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """``[(variable, time index [T])]`` -> ``[fields [T, H, W]]``, reading each missing chunk once (one compute)."""
        ds = self.dataset()
        located = []
        for variable, index in requests:
            bounds = self.bounds(variable)
            chunk = np.searchsorted(bounds, index, side="right") - 1
            located.append((variable, index, chunk, bounds))
        needed = dict.fromkeys((v, int(c)) for v, _, chunks, _ in located for c in np.unique(chunks))
        missing = [key for key in needed if key not in self._lru]
        self.hits += len(needed) - len(missing)
        if missing:
            import dask

            per_var: dict[str, list[int]] = {}
            for variable, c in missing:
                per_var.setdefault(variable, []).append(c)
            lazy, spans = [], []
            for variable, chunks in per_var.items():  # one fancy index per variable over its missing chunks
                bounds = self.bounds(variable)
                steps = np.concatenate([np.arange(bounds[c], bounds[c + 1]) for c in chunks])
                lazy.append(ds[variable].data[steps])
                spans.append((variable, chunks, bounds))
            # Synchronous: dask's thread pool does not survive a fork into DataLoader workers (reads would hang);
            # the workers are the parallelism.
            computed = dask.compute(*lazy, scheduler="synchronous")
            for data, (variable, chunks, bounds) in zip(computed, spans, strict=True):
                start = 0
                for c in chunks:
                    stop = start + int(bounds[c + 1] - bounds[c])
                    self._lru[(variable, c)] = np.asarray(data[start:stop], dtype=np.float32)
                    start = stop
            self.reads += len(missing)
            self.loaded.extend(missing)
        for key in needed:
            self._lru.move_to_end(key)
        out = []
        for variable, index, chunk, bounds in located:
            first = self._lru[(variable, int(chunk[0]))]
            field = np.empty((len(index), *first.shape[1:]), dtype=np.float32)
            for c in np.unique(chunk):  # a loop over chunks, each filled by one fancy index
                sel = chunk == c
                field[sel] = self._lru[(variable, int(c))][index[sel] - bounds[c]]
            out.append(field)
        while len(self._lru) > max(self.capacity, len(needed)):
            self._lru.popitem(last=False)
        return out


def coarsen_fields(fields: np.ndarray, factor: int) -> np.ndarray:
    """NaN-aware mean over ``factor x factor`` blocks: ``[..., H, W] -> [..., ceil(H / f), ceil(W / f)]``.

    Edge blocks average the points they have; a block with no finite value is NaN.
    """
    if factor <= 1:
        return fields
    *lead, h, w = fields.shape
    hc, wc = -(-h // factor), -(-w // factor)
    padded = np.full((*lead, hc * factor, wc * factor), np.nan, dtype=np.float32)
    padded[..., :h, :w] = fields
    blocks = padded.reshape(*lead, hc, factor, wc, factor)
    finite = np.isfinite(blocks)
    total = np.where(finite, blocks, 0.0).sum(axis=(-3, -1), dtype=np.float64)
    count = finite.sum(axis=(-3, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan).astype(np.float32)


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

    def sample(self, batch_size: int, generator: torch.Generator, split: _Split) -> Batch:
        """``batch_size`` tasks at random hours of ``split``: context ``grid [B, G, Dy]`` and ``stations``, targets."""
        b, s = batch_size, self.num_stations
        pick = torch.randint(len(split.target_time), (b,), generator=generator).numpy()
        low, high = self.context_fraction
        share = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64)
        n_ctx = np.minimum(np.floor(share.numpy() * s).astype(np.int64), s - 1)  # at least one target
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
        if self.target == "held_out":
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
        target = _observations(torch.from_numpy(self.station_x[idx_t]), y_t[..., None], mask_t, "target")
        extras = {
            "target_scale": torch.full((b,), float(self.station_std)),
            "coarse_sq_err": torch.from_numpy(np.nan_to_num(coarse_sq_err).astype(np.float32)),
            "num_targets": torch.from_numpy(num_targets.astype(np.float32)),
            "hour": torch.from_numpy(t_target.astype(np.int64)),
        }
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


def default_cache_dir() -> Path:
    """Where the embedded sample is prepared: ``$GRIDTNP_CACHE`` or ``~/.cache/gridtnp``."""
    return Path(os.environ.get("GRIDTNP_CACHE") or Path.home() / ".cache" / "gridtnp")


@register("datamodule", "era5_stations")
class StationReanalysisDataModule(TaskDataModule):
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
        unique_grid_points: bool = True,
    ) -> None:
        super().__init__(batch_size, train_batches, val_batches, test_batches, seed, num_workers)
        where = "StationReanalysisDataModule"
        check_counts(
            where,
            [("coarsen", coarsen, 1), ("time_offset_hours", time_offset_hours, 0), ("cache_chunks", cache_chunks, 1)],
        )
        low, high = (float(v) for v in context_fraction) if len(context_fraction) == 2 else (-1.0, -1.0)
        if not 0.0 <= low <= high <= 1.0:
            raise ConfigError(
                f"{where}: context_fraction must be (a, b) with 0 <= a <= b <= 1; got {context_fraction}."
            )
        if target not in ("held_out", "all"):
            raise ConfigError(f"{where}: target must be 'held_out' or 'all'; got {target!r}.")
        if isinstance(grid_variables, str) or not grid_variables:
            raise ConfigError(f"{where}: grid_variables must be a non-empty list of names; got {grid_variables!r}.")
        self.save_hyperparameters()
        self.store, self.stations = store, stations
        self.station_variable, self.grid_variables = station_variable, list(grid_variables)
        self.coarsen, self.context_fraction, self.target = coarsen, (low, high), target
        self.dates = {"train": tuple(train_dates), "val": tuple(val_dates), "test": tuple(test_dates)}
        self.time_offset_hours = time_offset_hours
        self.cache_chunks = cache_chunks
        self.storage_options, self.unique_grid_points = storage_options, unique_grid_points
        self.task: StationReanalysisTask | None = None
        self.splits: dict[str, _Split] = {}

    dim_x = 2

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source."""
        return {"grid": len(self.grid_variables), "stations": 1}

    target_dim_y = 1

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

    def setup(self, stage: str | None = None) -> None:
        """Open the store for metadata, check variables, dates and stations, and build the task sampler."""
        if self.task is not None:
            return
        from gridtnp.data.sample import STATIONS_SAMPLE, sample_path
        from gridtnp.data.stations import read_stations

        self.prepare_data()
        path = self.store_path()
        variables = list(dict.fromkeys([*self.grid_variables, self.station_variable]))
        ds = open_store(path, variables, self.storage_options)
        for v in variables:
            if ds[v].dims != DIMS:
                raise DataError(
                    f"{path}: variable {v!r} has dims {ds[v].dims}; station tasks need {DIMS} (select one level "
                    "when preparing the store)."
                )
        stats = {v: normalisation_stats(ds, v) for v in variables}
        for v, (mean, std) in stats.items():
            if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
                raise DataError(f"{path}: variable {v!r} has statistics mean {mean}, std {std}; need a finite std > 0.")
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
        station_x = kept[["latitude", "longitude"]].to_numpy(np.float64)
        station_index = np.stack([kept["lat_index"].to_numpy(np.int64), kept["lon_index"].to_numpy(np.int64)])

        time = ds.indexes["time"]
        self.splits = {}
        for name, (start, end) in self.dates.items():
            try:
                hours = select_time(ds, start, end).indexes["time"]
            except DataError as err:
                raise DataError(f"{name}_dates ({start}, {end}) with store {path}: {err}") from err
            target_time = np.arange(len(time))[time.isin(hours)]
            grid_time = time.get_indexer(time[target_time] - pd.Timedelta(hours=self.time_offset_hours))
            ok = grid_time >= 0
            if not ok.any():
                raise DataError(
                    f"{path}: no {name} hour from {start} to {end} has grid data {self.time_offset_hours} h earlier; "
                    f"the store covers {coverage(ds)}."
                )
            self.splits[name] = _Split(name, target_time[ok], grid_time[ok])
        _check_disjoint(self.splits, time)

        c = self.coarsen
        hc, wc = -(-len(lat) // c), -(-len(lon) // c)
        lat_c = coarsen_fields(np.broadcast_to(lat[:, None], (len(lat), len(lon))).astype(np.float32), c)
        lon_c = coarsen_fields(np.broadcast_to(lon[None, :], (len(lat), len(lon))).astype(np.float32), c)
        grid_x = np.stack([lat_c, lon_c], -1).reshape(hc * wc, 2)
        cache = ChunkCache(path, self.cache_chunks * len(variables), self.storage_options, variables)
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

    def split_task(self, name: str) -> _SplitTask:
        """The task generator of split ``name``, reading only that split's hours."""
        self.setup()
        assert self.task is not None
        return _SplitTask(self.task, self.splits[name])


def _check_disjoint(splits: dict[str, _Split], time: pd.DatetimeIndex) -> None:
    """A ``DataError`` if two splits share a target hour (their date ranges overlap)."""
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = np.intersect1d(splits[a].target_time, splits[b].target_time)
            if shared.size:
                raise DataError(
                    f"The {a} and {b} dates overlap ({shared.size} hours, from {_iso(time[shared[0]])}); "
                    "choose disjoint date ranges."
                )
