"""Multi-source spatio-temporal tasks (the gridded TNP paper's wind experiment): ``MultiSourceDataModule``
(registered as ``era5_multisource``), its sampler ``MultiSourceTask`` and ``Source`` (``"u@850"``).

A task is a lat/lon box over ``window`` consecutive hours, every point at ``x = (hour, lat, lon)``: one context
source per variable / level (``x [B, N, 3]``, ``y [B, N, 1]``) and targets ``x [B, Nt, 3]``,
``y [B, Nt, len(target_variables)]``; a forecast task (``task.context_hours``, ``task.lead_hours``) draws its
contexts at the context hours and its targets at the target hours (``lead_hours``) after an initial hour ``t``,
the hour column then the hours from ``t``. Details in the DataModule's docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import xarray as xr
from torch.utils.data import DataLoader, Dataset

from gridtnp.batch import Batch, declare_extras
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.datamodules import generator_from
from gridtnp.data.era5.forecast_hours import initial_hours
from gridtnp.data.era5.point_draws import field_index, first_by_key
from gridtnp.data.era5.sources import (
    DEFAULT_MULTISOURCE_TASK,
    MULTISOURCE_LOADER,
    MultiSourceTaskConfig,
    Source,
    level_indices,
)
from gridtnp.data.era5.to_xarray import Variable, window_predictions
from gridtnp.data.layout import DataError, coverage
from gridtnp.data.sections import (
    DEFAULT_SPLITS,
    DEFAULT_STORE,
    LoaderConfig,
    SplitDates,
    StoreConfig,
    plain,
    section,
)
from gridtnp.data.store import normalisation_stats, select
from gridtnp.data.store_datamodule import StoreDataModule, masked_observations, read_draws
from gridtnp.registry import register

declare_extras(
    "MultiSourceDataModule",
    {"lead_hours": ("[B, Nt]", "hours from the task's initial hour to each target's hour: the lead_<h>h/ metrics")},
)


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
        hours: Sequence[int] | None = None,
        roles: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.cache, self.sources, self.level_index = cache, list(sources), level_index
        self.targets = [s for s in self.sources if s.name in targets]  # context-source order
        self.mean = {s.name: np.float32(stats[s.name][0]) for s in self.sources}
        self.std = {s.name: np.float32(stats[s.name][1]) for s in self.sources}
        self.x_np = np.ascontiguousarray(x, dtype=np.float32)  # [P, 3] (hour in window, lat, lon) of every point
        self.x = torch.from_numpy(self.x_np)
        self.window, self.context_fraction, self.target_fraction = window, context_fraction, target_fraction
        # Forecast tasks: the hours from t of x's time slices, ``roles`` = (context slices, target slices) [T] each.
        self.offsets = np.arange(window) if hours is None else np.asarray(hours, dtype=np.int64)
        self.pools: tuple[np.ndarray, np.ndarray] | None = None  # [P] each: points a context / target may use
        if roles is not None:
            per_slice = len(self.x_np) // len(self.offsets)
            self.pools = (np.repeat(roles[0], per_slice), np.repeat(roles[1], per_slice))

    def points(self, idx: np.ndarray) -> torch.Tensor:
        """``x [B, N, 3]`` of the points ``idx [B, N]`` (a numpy gather: a third of torch's indexing cost)."""
        return torch.from_numpy(np.take(self.x_np, idx, axis=0))

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator,
        starts: np.ndarray,
        dense: bool = False,
        tasks_per_read: int = 1,
    ) -> Batch:
        """``batch_size`` windows starting at random hours of ``starts``: one context source per variable, targets.

        ``dense`` (predictions): the windows start at ``starts`` in order (``len(starts) == batch_size``), the
        contexts are drawn from every point and every point of the window is a target. ``tasks_per_read``: that
        many tasks in a row share a window (one read), each with its own targets and contexts.
        """
        b, p = batch_size, self.x_np.shape[0]
        pick = np.asarray(starts) if dense else starts[read_draws(len(starts), b, generator, tasks_per_read)]  # [B]
        steps = (pick[:, None] + self.offsets).reshape(-1)  # [B * T]
        variables = list(dict.fromkeys(s.variable for s in self.sources))
        fields = dict(zip(variables, self.cache.read([(v, steps) for v in variables]), strict=True))
        flat = {v: field.reshape(-1) for v, field in fields.items()}  # [B * T * (levels) * H * W], no copy
        levels = {v: field.shape[1] if field.ndim == 4 else 1 for v, field in fields.items()}
        plane = p // len(self.offsets)

        def normalised(s: Source, index: dict[int, np.ndarray], idx: np.ndarray) -> np.ndarray:
            """``[B, K]`` values of source ``s`` at the points ``idx``, normalised (``index``: its flat indices)."""
            n = levels[s.variable]
            if n not in index:
                index[n] = field_index(idx, p, plane, n)
            values = np.take(flat[s.variable][self.level_index.get(s.name, 0) * plane :], index[n])
            values -= self.mean[s.name]  # in place: the gather's own array
            values /= self.std[s.name]
            return values

        # Targets: a share `target_fraction` of the points (forecasts: at the target hours), every target variable
        # finite. Forecasts draw keys for every point, those outside a pool last, so both tasks use one generator.
        in_context, in_target = self.pools if self.pools is not None else (None, None)
        p_c, p_t = (p, p) if self.pools is None else (int(in_context.sum()), int(in_target.sum()))
        n_t = max(round(self.target_fraction * p_t), 1)
        if dense:
            n_t = 0  # contexts may use every point
            idx_t = np.tile(np.arange(p) if in_target is None else np.flatnonzero(in_target), (b, 1))
        else:
            keys = torch.rand(b, p, generator=generator).numpy()
            if in_target is not None:
                keys[:, ~in_target] = np.float32(2.0)
            idx_t = first_by_key(keys, n_t)  # [B, Nt]
        at_targets: dict[int, np.ndarray] = {}
        columns = [normalised(s, at_targets, idx_t) for s in self.targets]
        mask_t = np.logical_and.reduce([np.isfinite(c) for c in columns])  # [B, Nt], no reduction along Dy
        y_t = np.stack(columns, -1)  # [B, Nt, Dy]

        low, high = self.context_fraction
        context, rows = {}, (np.arange(b) * p)[:, None]  # [B, 1] each row's first flat index
        for s in self.sources:
            share = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64).numpy()
            n_c = np.floor(share * p_c).astype(np.int64)  # [B]
            # A random order of the points, target points of a target variable last: its context never holds them.
            order = torch.rand(b, p, generator=generator).numpy()
            if in_context is not None:
                order[:, ~in_context] = np.float32(3.0)
            if s in self.targets:
                if not dense:  # in place (the array is this draw's own), at the targets alone
                    order.reshape(-1)[idx_t + rows] = np.float32(2.0)  # a third of np.put's cost
                # The points left to the context: its pool less the targets in it (forecasts: at lead 0 only).
                free = p - n_t if in_context is None else p_c if dense else p_c - in_context[idx_t].sum(1)
                n_c = np.minimum(n_c, free)
            width = max(int(n_c.max()), 1)
            idx_c = first_by_key(order, width)  # [B, Nc]
            y_c = normalised(s, {}, idx_c)[..., None]
            mask_c = (np.arange(width) < n_c[:, None]) & np.isfinite(y_c[..., 0])
            context[s.name] = masked_observations(self.points(idx_c), y_c, mask_c, f"context[{s.name!r}]")

        target = masked_observations(self.points(idx_t), y_t, mask_t, "target")
        extras = {"start_hour": torch.from_numpy(pick.astype(np.int64))}
        if self.pools is not None:  # hours from t of each target: the lead_<h>h/ metrics
            extras["lead_hours"] = target.x[..., 0].clone()
        if len(self.targets) == 1:  # metrics in physical units need one scale per task
            extras["target_scale"] = torch.full((b,), float(self.std[self.targets[0].name]))
        return Batch(context, target, extras)


class _WindowTask:
    """The ``Task`` interface of one split of a ``MultiSourceTask``: windows starting at ``starts``."""

    def __init__(self, task: MultiSourceTask, starts: np.ndarray, tasks_per_read: int = 1) -> None:
        self.task, self.starts, self.tasks_per_read = task, starts, tasks_per_read

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.task.sample(batch_size, generator, self.starts, tasks_per_read=self.tasks_per_read)


class _WindowPredictSet(Dataset):
    """Prediction batches of a ``MultiSourceDataModule``: non-overlapping windows of the test split, in order (forecast
    tasks: every initial hour)."""

    def __init__(self, dm: MultiSourceDataModule) -> None:
        self.task, self.batch_size, self.seed = dm.task, dm.batch_size, dm.seed
        starts = dm.starts["test"]
        chosen, next_free = [], -1
        for start in starts:  # greedy: the next window starts once the previous one has ended
            if start >= next_free:
                chosen.append(start)
                next_free = start + dm.window
        self.starts = np.asarray(starts if dm.lead_hours else chosen, dtype=np.int64)  # forecasts: every initial hour

    def __len__(self) -> int:
        return -(-len(self.starts) // self.batch_size)

    def __getitem__(self, index: int) -> Batch:
        starts = self.starts[index * self.batch_size : (index + 1) * self.batch_size]
        generator = generator_from(self.seed, "predict", int(index))
        return self.task.sample(len(starts), generator, starts, dense=True)


@register("datamodule", "era5_multisource")
class MultiSourceDataModule(StoreDataModule):
    """Multi-source spatio-temporal tasks: each variable / pressure level a context source, over a box and T hours.

    The gridded TNP paper's wind experiment: each variable / pressure level is its own context source over a
    lat/lon box and ``window`` consecutive hours.

    Every point of a task has ``x = (hour in the window, lat, lon)`` (``dim_x = 3``, hours ``0 .. window - 1``,
    degrees), so the model's grid can span ``[window, lat, lon]``. Context source ``name`` (``"u850"`` for
    ``"u@850"``): a share ``~ U[context_fraction]`` (drawn per task and source) of that variable's points,
    ``y [B, N, 1]``. Targets: a share ``target_fraction`` of the points, ``y [B, Nt, len(target_variables)]``;
    a target variable's context never contains the target points. Values are normalised with the store's
    training-period statistics (per level when the store has them); NaNs are masked out. ``extras``:
    ``start_hour`` (index into the store's time axis of each window's first hour) and, with one target
    variable, ``target_scale`` (its std, for metrics in physical units).

    Forecast tasks (``task.context_hours = [a, b]``, ``task.lead_hours``): from an initial hour ``t``, each context
    source's share is of the points at hours ``t + a .. t + b``, the targets' share of the points at ``t + h`` for
    each lead ``h``; ``x = (hours from t, lat, lon)``; each split's initial hours keep every context and lead hour
    inside it; ``start_hour`` is ``t``'s index, and the targets' hours from ``t`` are ``extras["lead_hours"]``
    (``gridtnp test`` then logs ``test/lead_<h>h/`` metrics). Predictions: every initial hour of the test split, on
    ``(init_time, lead_time, latitude, longitude)``.

    Args:
        store: the store section (``gridtnp.data.sections.StoreConfig``; the embedded sample holds t2m only).
        splits: the train, val and test dates (``SplitDates``; a window lies wholly inside its split).
        loader: batch size, batches per epoch and per fixed evaluation set, seed, workers (``LoaderConfig``).
        task: the sources, targets and window (``MultiSourceTaskConfig``).
    """

    MOVED_ARGUMENTS = {name: f"task.{name}" for name in ("variables", "target_variables", "window",
                                                          "context_fraction", "target_fraction")}  # fmt: skip

    def __init__(
        self,
        store: StoreConfig = DEFAULT_STORE,
        splits: SplitDates = DEFAULT_SPLITS,
        loader: LoaderConfig = MULTISOURCE_LOADER,
        task: MultiSourceTaskConfig = DEFAULT_MULTISOURCE_TASK,
    ) -> None:
        super().__init__(store, splits, loader)
        options = section(MultiSourceTaskConfig, task, "task")
        sections = {"store": self.store_config, "splits": self.split_dates, "loader": self.loader, "task": options}
        self.save_hyperparameters({name: plain(value) for name, value in sections.items()})
        self.sources = [Source(v) for v in options.variables]
        self.targets = [Source(v).name for v in options.target_variables or options.variables]
        self.window, self.context_fraction, self.options = options.window, options.context_fraction, options
        self.lead_hours = list(options.lead_hours or ())  # forecast tasks' lead hours; [] for windows
        self.target_fraction = options.target_fraction
        self.task: MultiSourceTask | None = None
        self.starts: dict[str, np.ndarray] = {}

    dim_x = 3

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source (one variable each)."""
        return {s.name: 1 for s in self.sources}

    def setup(self, stage: str | None = None) -> None:
        """Open the store for metadata, check variables, levels, region and dates, and build the task sampler."""
        if self.task is not None:
            return
        path = self.store_path()
        variables = list(dict.fromkeys(s.variable for s in self.sources))
        ds = self.open(variables)
        box = select(ds, region=self.read_region()) if self.region is not None else ds
        lat, lon = box["latitude"].values, box["longitude"].values
        region = {
            "latitude": _index_slice(ds["latitude"].values, lat),
            "longitude": _index_slice(ds["longitude"].values, lon),
        }
        level_index = level_indices(ds, self.sources, path)
        stats = {
            s.name: normalisation_stats(ds, s.variable, s.level, source=path, given=self.stats) for s in self.sources
        }
        time = ds.indexes["time"]
        self.starts = {}
        for name, hours in self.split_hours(ds, path).items():
            if self.options.forecast:  # initial hours t with every context and lead hour inside the split
                where = f"{path}: {name} dates {self.dates[name][0]} to {self.dates[name][1]}"
                self.starts[name] = hours[initial_hours(time, hours, self.options, where, consecutive=True)[1]]
                continue
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
        hours, roles = self.options.slices()
        t, la, lo = np.meshgrid(np.asarray(hours, dtype=np.float64), lat, lon, indexing="ij")
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
            hours,
            roles,
        )

    def source_variables(self) -> dict[str, list[str]]:
        """Each context source is one variable (or level): ``{name: [name]}``."""
        return {s.name: [s.name] for s in self.sources}

    def target_variables(self) -> list[str]:
        """The target variables' source names, in the order of the targets' ``y`` columns (the sources' order)."""
        return [s.name for s in self.sources if s.name in self.targets]

    def store_variable(self, name: str) -> tuple[str, float | None]:
        """The store's variable and level of source ``name`` (``("u", 850.0)`` for ``"u850"``)."""
        source = next(s for s in self.sources if s.name == name)
        return source.variable, source.level

    def describe(self) -> str:
        """One line on what the tasks hold (after ``setup``), printed at the start of ``gridtnp fit``: the sources,
        the region's points, the window and each split's windows."""
        lat, lon = self.box
        windows = ", ".join(f"{name} {len(starts):,}" for name, starts in self.starts.items())
        if self.options.forecast:
            (a, b), leads = self.options.context_hours, ", ".join(map(str, self.lead_hours))  # type: ignore[misc]
            return (
                f"{len(self.sources)} sources ({', '.join(s.name for s in self.sources)}) on {len(lat):,} x "
                f"{len(lon):,} grid points, context hours {a} to {b}, lead hours {leads}; targets "
                f"{', '.join(self.targets)}; initial hours: {windows}"
            )
        return (
            f"{len(self.sources)} sources ({', '.join(s.name for s in self.sources)}) on {len(lat):,} x {len(lon):,} "
            f"grid points, windows of {self.window} hours; targets {', '.join(self.targets)}; window starts: "
            f"{windows}"
        )

    def predict_dataloader(self) -> DataLoader:
        """Consecutive, non-overlapping windows of the test split, ``batch_size`` a batch, predicted at every point."""
        self.setup()
        return DataLoader(_WindowPredictSet(self), shuffle=False, **self.loader_kwargs())

    def predictions_to_xarray(self, outputs: Sequence[dict[str, torch.Tensor]]) -> xr.Dataset:
        """``gridtnp predict`` outputs -> ``<variable>_mean``, ``<variable>_std`` on ``(time, latitude, longitude)``
        in physical units, one variable per target variable."""
        assert self.task is not None
        variables = [
            Variable(
                s.name, s.spec, self.units.get(s.name, ""), float(self.task.mean[s.name]), float(self.task.std[s.name])
            )
            for s in self.task.targets
        ]
        attrs = {"context": ", ".join(s.spec for s in self.sources), "context_fraction": list(self.context_fraction)}
        return window_predictions(
            outputs, self.time_axis, self.window, self.box, variables, self.store_path(), attrs, self.lead_hours
        )

    def split_task(self, name: str) -> _WindowTask:
        """The task generator of split ``name``: windows wholly inside that split."""
        self.setup()
        assert self.task is not None
        return _WindowTask(self.task, self.starts[name], self.tasks_per_read if name == "train" else 1)


def _index_slice(axis: np.ndarray, selected: np.ndarray) -> slice:
    """The index slice of ``axis`` holding the (contiguous) ``selected`` values."""
    first = int(np.searchsorted(axis, selected[0]))
    return slice(first, first + len(selected))
