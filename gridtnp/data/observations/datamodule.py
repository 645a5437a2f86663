"""``ObservationDataModule`` (registered as ``era5_observations``): station observations from a long-format file as
context and targets beside a gridded store, and its ``observations:`` section ``ObservationConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from lightning.pytorch.utilities import rank_zero_warn

from gridtnp.data.era5.station_options import (
    DEFAULT_PREDICT,
    STATION_LOADER,
    StationPredictConfig,
    StationTaskConfig,
)
from gridtnp.data.era5.station_reanalysis import StationReanalysisDataModule
from gridtnp.data.era5.station_tasks import Split
from gridtnp.data.layout import DIMS, DataError, coverage
from gridtnp.data.observations.join import observations_to_hours
from gridtnp.data.observations.table import Problem, read_observations
from gridtnp.data.observations.tasks import ObservationTask, held_out_stations
from gridtnp.data.sections import DEFAULT_SPLITS, DEFAULT_STORE, LoaderConfig, SplitDates, StoreConfig, plain, section
from gridtnp.data.store import normalisation_stats, region_index, select
from gridtnp.registry import ConfigError, register

#: Lines of an observation file's problems printed (the rest are counted).
LINES_SHOWN = 10


@dataclass(frozen=True)
class ObservationConfig:
    """The station observations (``observations:``).

    Args:
        path: a long-format CSV (``.csv``, ``.csv.gz``) or Parquet file (docs/data.md, "Station observations");
            None: the embedded sample's synthetic observations.
        time_tolerance: a report within this of a store time belongs to it (pandas time span: ``30min``, ``10min``).
        held_out: the share of stations held out as targets (by a seeded hash of the station identifier).
        held_out_seed: the seed of that split.
        held_out_stations: the held-out stations by identifier, instead of the share.
        station_list: a CSV with a ``station_id`` column: reports of other stations are refused.
        duplicates: conflicting reports of one station and time: ``refuse`` (a line each) or ``mean`` (averaged).
    """

    path: str | None = None
    time_tolerance: str = "30min"
    held_out: float = 0.2
    held_out_seed: int = 0
    held_out_stations: tuple[str, ...] | None = None
    station_list: str | None = None
    duplicates: Literal["refuse", "mean"] = "refuse"

    def __post_init__(self) -> None:
        try:
            if pd.Timedelta(self.time_tolerance) < pd.Timedelta(0):
                raise ValueError
        except ValueError as err:
            raise ConfigError(
                f"observations.time_tolerance must be a time span >= 0 such as 30min; got {self.time_tolerance!r}."
            ) from err
        if not 0.0 < float(self.held_out) < 1.0:
            raise ConfigError(f"observations.held_out must be a share in (0, 1); got {self.held_out!r}.")
        if self.duplicates not in ("refuse", "mean"):
            raise ConfigError(f"observations.duplicates must be 'refuse' or 'mean'; got {self.duplicates!r}.")
        if self.held_out_stations is not None:
            object.__setattr__(self, "held_out_stations", tuple(str(s) for s in self.held_out_stations))


DEFAULT_OBSERVATIONS = ObservationConfig()
#: Every observed station that reported is context at evaluation: training draws large shares of them too.
DEFAULT_OBSERVATION_TASK = StationTaskConfig(context_fraction=(0.5, 1.0), targets="held_out")


def report_problems(problems: list[Problem], source: str) -> None:
    """A DataError listing the fatal problems (one line each) when there are any; else one warning that counts the
    dropped reports by column and shows the first lines."""
    fatal = [p for p in problems if p.fatal]
    shown = fatal or problems
    if not shown:
        return
    lines = "\n".join(f"  {p}" for p in shown[:LINES_SHOWN])
    more = f"\n  ... and {len(shown) - LINES_SHOWN} more" if len(shown) > LINES_SHOWN else ""
    if fatal:
        raise DataError(f"{source}: {len(fatal)} bad row(s) refused:\n{lines}{more}")
    counts = pd.Series([p.column for p in problems]).value_counts()
    summary = ", ".join(f"{n} in {column}" for column, n in counts.items())
    rank_zero_warn(f"{source}: {len(problems)} report(s) or station(s) dropped ({summary}):\n{lines}{more}")


@register("datamodule", "era5_observations")
class ObservationDataModule(StationReanalysisDataModule):
    """Station observations as context and targets beside a gridded store (coarse grid context as the station task).

    Reports (``observations.path``, long format) are joined to the store's hours (``observations.time_tolerance``;
    ``gridtnp.data.observations.join``); a station is held out or observed by its identifier
    (``observations.held_out``, seeded), never by report. A task is one hour: context ``"grid"`` as in
    ``StationReanalysisDataModule`` (``task:`` blocks, offsets, climatology, time features) and ``"stations"``: the
    observed stations that reported in that hour, ``x`` = the file's coordinates, ``y [B, Nc, 1]`` normalised
    (departures from the climatology of the station's grid point with ``task.climatology``), padded and masked.
    Targets: in training, the other reporting observed stations (``task.targets: held_out``; ``all``: every one,
    with ``is_context``) after a ``task.context_fraction`` share as context; in validation and test (every hour of
    their dates), every reporting observed station is context and the held-out stations' reports are the targets.
    Held-out stations never appear in training. ``coarse_sq_err``: the nearest coarse block's value as the baseline.

    Args:
        store: the store section (``StoreConfig``); ``store.region`` also bounds the stations.
        splits: the train, val and test dates (``SplitDates``).
        loader: batch size, training batches per epoch, seed and workers (``LoaderConfig``).
        task: the grid context and context share (``StationTaskConfig``; ``station_variable`` names the file's value
            column and the store variable of the same units; ``random_points`` and ``num_targets`` do not apply).
        observations: the observation file and how it is joined and split (``ObservationConfig``).
        predict: what ``gridtnp predict`` covers (``StationPredictConfig``: every station, or a grid).
    """

    def __init__(
        self,
        store: StoreConfig = DEFAULT_STORE,
        splits: SplitDates = DEFAULT_SPLITS,
        loader: LoaderConfig = STATION_LOADER,
        task: StationTaskConfig = DEFAULT_OBSERVATION_TASK,
        observations: ObservationConfig = DEFAULT_OBSERVATIONS,
        predict: StationPredictConfig = DEFAULT_PREDICT,
    ) -> None:
        super().__init__(store, splits, loader, task, None, predict)
        if self.options.random_points is not None or self.options.num_targets is not None:
            raise ConfigError("era5_observations: task.random_points and task.num_targets do not apply to observed "
                              "stations; remove them.")  # fmt: skip
        self.observations = section(ObservationConfig, observations, "observations")
        self.save_hyperparameters(
            {
                "store": plain(self.store_config),
                "splits": plain(self.split_dates),
                "loader": plain(self.loader),
                "task": plain(self.options),
                "observations": plain(self.observations),
                "predict": plain(self.predict),
            }
        )

    def observation_path(self) -> str:
        """The observation file: ``observations.path`` or the embedded sample's."""
        from gridtnp.data.sample import OBSERVATIONS_SAMPLE, sample_path

        return str(self.observations.path or sample_path(OBSERVATIONS_SAMPLE))

    def setup(self, stage: str | None = None) -> None:
        """Open the store, read and join the observations (refusing bad rows), split stations, build the sampler."""
        if self.task is not None:
            return
        path, config = self.store_path(), self.observations
        variables = list(dict.fromkeys([*self.grid_variables, self.station_variable]))
        ds = self.open(variables)
        region = None
        if self.region is not None:
            box = select(ds, region=self.read_region())
            region, ds = region_index(ds, box), box
        for v in variables:
            if ds[v].dims != DIMS:
                raise DataError(f"{path}: variable {v!r} has dims {ds[v].dims}; observation tasks need {DIMS}.")
        stats = {v: normalisation_stats(ds, v, source=path, given=self.stats) for v in variables}
        lat, lon, time = ds["latitude"].values, ds["longitude"].values, ds.indexes["time"]

        file = self.observation_path()
        known = None
        if config.station_list is not None:
            known = pd.read_csv(config.station_list, dtype=str)["station_id"].str.strip().tolist()
        table, problems = read_observations(file, [self.station_variable], known, config.duplicates)
        reports, joined = observations_to_hours(
            table, time, lat, lon, [self.station_variable], config.time_tolerance, Path(file).name
        )
        report_problems(problems + joined, Path(file).name)
        ids = reports.stations["station_id"].astype(str)
        if config.held_out_stations is not None:
            held = ids.isin(config.held_out_stations).to_numpy()
        else:
            held = held_out_stations(ids.tolist(), config.held_out, config.held_out_seed)
        if held.all() or not held.any():
            raise DataError(
                f"{file}: {int(held.sum())} of {len(held)} station(s) with reports in the store are held out; "
                "need at least one held-out and one observed station (set observations.held_out or held_out_stations)."
            )
        self.station_table = reports.stations.assign(held_out=held)
        self.time_axis, self.box = time, (lat, lon)
        self.units = str(ds[self.station_variable].attrs.get("units", ""))
        self.long_name = str(ds[self.station_variable].attrs.get("long_name", self.station_variable))
        dropped = len(problems + joined)
        self._counts = (file, len(held), int(held.sum()), int(reports.mask.sum()), reports.merged, dropped)
        self.splits = {}
        for name, target_time in self.split_hours(ds, path).items():
            grid_time = time.get_indexer(time[target_time] - pd.Timedelta(hours=self.time_offset_hours))
            if not (grid_time >= 0).any():
                raise DataError(f"{path}: no {name} hour has grid data {self.time_offset_hours} h earlier; the store "
                                f"covers {coverage(ds)}.")  # fmt: skip
            self.splits[name] = Split(name, target_time[grid_time >= 0], grid_time[grid_time >= 0])
        layouts = {"train": self.layouts["train"], "val": self.layouts["eval"], "test": self.layouts["eval"]}
        clock = (time.hour + time.minute / 60.0).to_numpy(np.float64) if self.time_features else None
        self.task = ObservationTask(
            self.chunk_cache(variables, region), self.grid_variables, self.station_variable, stats, (lat, lon),
            reports, held, len(time), layouts=layouts, context_fraction=self.context_fraction, targets=self.targets,
            hour_of_day=clock, hour_index=time.hour.to_numpy(np.int64),
            climatology=self.hourly_climatology(ds, variables, path, region) if self.climatology else None,
            coverage_dropout=self.options.coverage_dropout, eval_trim=self.options.trim_sides,
        )  # fmt: skip

    def describe(self) -> str:
        """One line on the stations, reports and tasks (after ``setup``), printed at the start of ``gridtnp fit``."""
        file, stations, held, reports, merged, dropped = self._counts
        hours = {k: len(v.target_time) for k, v in self.splits.items()}
        factors = self.layouts["train"][0]
        return (
            f"{reports:,} reports of {stations:,} stations in {Path(file).name} ({held:,} held out; {dropped:,} "
            f"problem line(s), {merged:,} reports merged into an hour another was nearer) on "
            f"{len(self.box[0]):,} x {len(self.box[1]):,} grid points; grid {', '.join(self.grid_variables) or 'none'} "
            f"in {' or '.join(f'{c} x {c}' for c in factors)} blocks; train {hours['train']:,} hours, val "
            f"{hours['val']:,} hours, test {hours['test']:,} hours"
        )
