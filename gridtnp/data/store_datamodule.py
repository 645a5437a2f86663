"""``StoreDataModule``: the base of every DataModule that reads a prepared Zarr store (``gridtnp data prepare``) or
the embedded sample (date splits, a chunk cache), and what their task samplers share.

* ``StoreDataModule(store, splits, loader)`` (sections of ``gridtnp.data.sections``):
  ``store_path()``, ``prepare_data()``, ``open(variables)``,
  ``chunk_cache(variables, region)``, ``split_hours(ds, path) -> {split: time indices [T]}``.
* ``default_cache_dir()``: where the embedded sample is prepared (``$GRIDTNP_CACHE`` or ``~/.cache/gridtnp``).
* ``masked_observations(x [B, N, Dx], y [B, N, Dy], mask [B, N], name)``: ``Observations`` with masked values zeroed.
* ``read_draws(count, batch_size, generator, tasks_per_read)``: ``[B]`` random draws of ``range(count)``, each
  repeated for ``tasks_per_read`` tasks in a row (``store.tasks_per_read``).

``StoreDataModule.variable_metadata()`` describes the data for checkpoints (``NeuralProcessModule`` saves it), so
that ``gridtnp.predictions.predict`` can normalise a user's physical-unit inputs from a checkpoint alone.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from gridtnp.batch import Observations
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.datamodules import TaskDataModule
from gridtnp.data.layout import STATS_ATTR, DataError, iso, select_time
from gridtnp.data.sections import (
    MOVED_STORE_ARGUMENTS,
    SAMPLE_TRAIN_DATES,
    LoaderConfig,
    SplitDates,
    StoreConfig,
    section,
)
from gridtnp.data.store import normalisation_stats, open_store, unwrapped_region

SAMPLE_CACHE_NAME = "era5_t2m_uk_2019-03"


def masked_observations(x: torch.Tensor, y: np.ndarray, mask: np.ndarray, name: str) -> Observations:
    """Observations with masked values zeroed, so that no NaN ever reaches a tensor: ``y [B, N, Dy]``."""
    y = np.array(y, dtype=np.float32)  # the tensor's own copy
    hole = ~mask
    if y.shape[-1] == 1:  # one column: a masked copy, a tenth of a boolean assignment's cost
        np.copyto(y[..., 0], np.float32(0.0), where=hole)
    else:  # a mask broadcast along Dy would cost four times these rows
        y[hole] = np.float32(0.0)
    return Observations(x.contiguous(), torch.from_numpy(y), torch.from_numpy(np.ascontiguousarray(mask)), name)


def read_draws(count: int, batch_size: int, generator: torch.Generator, tasks_per_read: int = 1) -> np.ndarray:
    """``[B]`` indices drawn uniformly from ``range(count)``, each drawn one repeated for ``tasks_per_read`` tasks in
    a row (``ceil(B / tasks_per_read)`` draws); with 1, the one ``torch.randint`` draw every task always had."""
    draws = -(-batch_size // tasks_per_read)
    picked = torch.randint(count, (draws,), generator=generator).numpy()
    return picked if tasks_per_read == 1 else np.repeat(picked, tasks_per_read)[:batch_size]


def default_cache_dir() -> Path:
    """Where the embedded sample is prepared: ``$GRIDTNP_CACHE`` or ``~/.cache/gridtnp``."""
    return Path(os.environ.get("GRIDTNP_CACHE") or Path.home() / ".cache" / "gridtnp")


class StoreDataModule(TaskDataModule):
    """What the ERA5 DataModules share: a prepared store (or the embedded sample), date splits and loaders.

    Subclasses give ``source_variables()``, ``target_variables()`` and ``split_task(split)``. ``store.path=None``
    prepares the embedded ERA5 sample once into ``$GRIDTNP_CACHE`` (default ``~/.cache/gridtnp``) with statistics
    over the training dates, and reuses it. ``split_hours`` refuses a store whose normalisation statistics were
    computed over hours of the validation or test dates (information from them would leak into every input), unless
    ``store.allow_stats_overlap``.

    Args:
        store: the store section (``StoreConfig``: path, storage options, layout, statistics, chunk cache, region).
        splits: the date splits (``SplitDates``).
        loader: batching and workers (``LoaderConfig``).
    """

    #: Where each argument of the flat recipe layout went (``gridtnp.data.sections.moved_argument``).
    MOVED_ARGUMENTS = MOVED_STORE_ARGUMENTS

    def __init__(
        self,
        store: StoreConfig | None = None,
        splits: SplitDates | None = None,
        loader: LoaderConfig | None = None,
    ) -> None:
        super().__init__(loader)
        self.store_config = section(StoreConfig, store, "store")
        self.split_dates = section(SplitDates, splits, "splits")
        config = self.store_config
        self.store, self.storage_options = config.path, config.storage_options
        self.convert_layout, self.stats = config.convert_layout, dict(config.stats or {})
        self.allow_stats_overlap, self.cache_chunks = config.allow_stats_overlap, config.cache_chunks
        self.region, self.tasks_per_read, self.local_cache = config.region, config.tasks_per_read, config.local_cache
        self.dates = self.split_dates.as_dict()
        self._metadata: dict[str, Any] | None = None

    @abstractmethod
    def source_variables(self) -> dict[str, list[str]]:
        """The variables of each context source, in the order of its ``y`` columns: ``{source: [name, ...]}``."""

    @abstractmethod
    def target_variables(self) -> list[str]:
        """The variables predicted at the targets, in the order of the targets' ``y`` columns."""

    def store_variable(self, name: str) -> tuple[str, float | None]:
        """The store's variable and level behind a name of ``source_variables`` (the same name, no level)."""
        return name, None

    def variable_metadata(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the data, or None before ``setup``: ``{"variables": {name: {"mean", "std",
        "units", "long_name"}}, "sources": {source: [name, ...]}, "target": [name, ...], "store": path}``, with
        the statistics the tasks are normalised with (``stats``, else the store's)."""
        if self.task is None:
            return None
        if self._metadata is None:
            sources, targets = self.source_variables(), self.target_variables()
            names = {
                n: self.store_variable(n) for n in dict.fromkeys([*(n for v in sources.values() for n in v), *targets])
            }
            path = self.store_path()
            ds = self.open(list(dict.fromkeys(variable for variable, _ in names.values())))
            variables = {}
            for name, (variable, level) in names.items():
                mean, std = normalisation_stats(ds, variable, level, source=path, given=self.stats)
                attrs = ds[variable].attrs
                variables[name] = {
                    "mean": mean,
                    "std": std,
                    "units": str(attrs.get("units", "")),
                    "long_name": str(attrs.get("long_name", variable)),
                }
            self._metadata = {
                "variables": variables,
                "sources": sources,
                "target": targets,
                "store": path,
            }
        return self._metadata

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
        from gridtnp.data.sample.store import write_sample_store

        out = Path(self.store_path())
        if out.exists():
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        write_sample_store(out, self.dates["train"])

    def open(self, variables: Sequence[str]) -> xr.Dataset:
        """The store (prepared first if it is the sample), lazily (xarray's backend arrays, no dask), with
        ``variables`` only."""
        self.prepare_data()
        return open_store(
            self.store_path(), variables, self.storage_options, self.convert_layout, False, True, self.west()
        )

    def west(self) -> float | None:
        """Where a ``region`` across the date line (``lon_min > lon_max``, or past 180 in 0-360 degrees) starts: a
        global store is read with its columns from there eastward (``gridtnp.data.store.longitudes_from``); None
        for any other region."""
        box = self.read_region()
        return box[2] if box is not None and box[3] > 180.0 else None

    def read_region(self) -> tuple[float, float, float, float] | None:
        """``region`` in the longitudes the store is read in: one run east of ``lon_min`` for a box across the date
        line (``unwrapped_region``)."""
        return unwrapped_region(self.region) if self.region is not None else None

    def chunk_cache(self, variables: Sequence[str], region: dict[str, slice] | None = None) -> ChunkCache:
        """A per-process chunk cache on the store for ``variables`` (``cache_chunks`` chunks per variable)."""
        capacity = self.cache_chunks * len(variables)
        return ChunkCache(
            self.store_path(),
            capacity,
            self.storage_options,
            variables,
            region,
            self.convert_layout,
            west=self.west(),
            local_cache=self.local_cache,
        )

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
        if not self.allow_stats_overlap:
            self.check_stats_period(ds, path, hours)
        names = list(hours)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                shared = np.intersect1d(hours[a], hours[b])
                if shared.size:
                    first = iso(time[shared[0]])
                    raise DataError(
                        f"The {a} and {b} dates overlap ({shared.size} hours, from {first}); "
                        "choose disjoint date ranges."
                    )
        return hours

    def check_stats_period(self, ds: xr.Dataset, path: str, hours: dict[str, np.ndarray]) -> None:
        """A DataError when the store's statistics of a variable in ``ds`` (not overridden by ``stats``) were
        computed over hours of a split other than ``train`` (``hours``: indices into ``ds.time`` per split)."""
        time = ds.indexes["time"]
        recorded = ds.attrs.get(STATS_ATTR, {})
        for variable in ds.data_vars:
            entry = recorded.get(variable, {})
            given = any(k == variable or k.startswith(f"{variable}@") for k in self.stats)
            if given or "train_start" not in entry or "train_end" not in entry:
                continue
            start, end = np.datetime64(entry["train_start"]), np.datetime64(entry["train_end"])
            for split, index in hours.items():
                if split == "train":
                    continue
                inside = (time[index] >= start) & (time[index] <= end)
                if inside.any():
                    first, last = self.dates[split]
                    train = self.dates["train"]
                    raise DataError(
                        f"{path}: the normalisation statistics of {variable!r} were computed over "
                        f"{entry['train_start']} to {entry['train_end']}, which includes {int(inside.sum())} hours "
                        f"of the {split} dates {first} to {last}: the {split} scores would see {split} data. "
                        f"Prepare the store with --train-start {train[0]} --train-end {train[1]} (the training "
                        f"dates), pass stats: {{{variable}: [mean, std]}}, or set allow_stats_overlap: true to "
                        "accept the overlap."
                    )
