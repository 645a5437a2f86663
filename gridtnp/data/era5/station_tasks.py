"""The station + reanalysis task sampler behind ``StationReanalysisDataModule``.

* ``StationReanalysisTask``: draws a batch of tasks (one hour each) of a split: the coarse context on each task's
  block layout (training tasks with parts of it missing under ``coverage_dropout``, evaluation trimmed by
  ``eval_trim``), a share of the stations as context, the stations (or given points) as targets.
* ``SplitTask``: the ``Task`` interface of one split (training);
  ``HourSet``: every hour of a split once, in order (validation, test, predictions).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from gridtnp.batch import Batch
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.datamodules import generator_from
from gridtnp.data.era5.blocks import BlockLayout, LayoutTables, draw_layouts
from gridtnp.data.era5.coverage_masks import dropout_mask, trim_mask
from gridtnp.data.era5.forecast_times import Split, forecast_batch
from gridtnp.data.era5.station_options import CoverageDropout
from gridtnp.data.store_datamodule import masked_observations, read_draws


class StationReanalysisTask:
    """Draws batches of station + reanalysis tasks; see ``StationReanalysisDataModule`` for the task."""

    def __init__(
        self,
        cache: ChunkCache,
        grid_variables: Sequence[str],
        station_variable: str,
        stats: dict[str, tuple[float, float]],
        coords: tuple[np.ndarray, np.ndarray],
        station_index: np.ndarray,
        layouts: dict[str, tuple[Sequence[int], Sequence[int] | None]],
        context_fraction: tuple[float, float],
        targets: str,
        hour_of_day: np.ndarray | None = None,
        climatology: dict[str, np.ndarray] | None = None,
        hour_index: np.ndarray | None = None,
        random_points: int | None = None,
        num_targets: int | None = None,
        coverage_dropout: CoverageDropout | None = None,
        eval_trim: tuple[int, int, int, int] | None = None,
    ) -> None:
        self.cache, self.grid_variables, self.station_variable = cache, list(grid_variables), station_variable
        self.mean = np.array([stats[v][0] for v in self.grid_variables], dtype=np.float32)
        self.std = np.array([stats[v][1] for v in self.grid_variables], dtype=np.float32)
        self.station_mean, self.station_std = (np.float32(s) for s in stats[station_variable])
        self.lat, self.lon = (np.asarray(c, dtype=np.float64) for c in coords)
        self.shape = (len(self.lat), len(self.lon))
        self.wrap_lon = (
            bool(np.isclose(abs(self.lon[1] - self.lon[0]) * len(self.lon), 360.0)) if len(self.lon) > 1 else False
        )
        self.station_index = station_index  # [2, S] (lat, lon) index of each station's grid point
        self.station_flat = station_index[0] * self.shape[1] + station_index[1]  # [S]
        # x is the grid point the value is read from (as in the paper), not the CSV coordinate up to half a cell away.
        self.station_x = np.stack([self.lat[station_index[0]], self.lon[station_index[1]]], -1).astype(np.float32)
        self.layouts, self.context_fraction, self.targets = layouts, context_fraction, targets
        # Block centres and the station blocks' points per layout, built once (a handful of layouts per run).
        self.tables = LayoutTables(self.lat, self.lon, self.wrap_lon, self.station_flat)
        self.hour_of_day = hour_of_day  # [T] hour of day (fractional) of each store time, or None
        # {variable: [24, H * W]} mean of each UTC hour of day over the training dates, and [T] each time's hour:
        # values are then departures from it (the DataModule's ``climatology``).
        self.climatology, self.hour_index = climatology, hour_index
        # Off-the-grid values at this many uniformly random fine grid points per task instead of the stations, and
        # a fixed number of held-out targets (the {On, Off}-the-grid thesis's ERA5 task).
        self.random_points, self.num_targets = random_points, num_targets
        # Training tasks with parts of the coarse grid missing; evaluation tasks with (north, south, west, east)
        # block rows / columns left out: masked out of the grid context.
        self.coverage_dropout, self.eval_trim = coverage_dropout, eval_trim
        self.ascending = (bool(self.lat[-1] >= self.lat[0]), bool(self.lon[-1] >= self.lon[0]))
        if climatology is not None and hour_index is None:
            raise ValueError("StationReanalysisTask: a climatology needs the hour of day of every time (hour_index).")

    def build_tables(self, split: str, most: int = 64) -> int:
        """Build the layout tables (block centres; the stations' block members) of every layout ``split`` draws,
        when there are at most ``most`` of them (each holds about 2.5 MB at global 0.25 degree with 9,159
        stations); returns how many were built. Built before DataLoader workers start, they are shared by all of
        them (copy-on-write after the fork, or pickled with the task)."""
        factors, offset = self.layouts.get(split, self.layouts["train"])
        keys = [
            (int(f), int(a), int(b))
            for f in dict.fromkeys(factors)
            for a, b in ([tuple(offset)] if offset is not None else itertools.product(range(int(f)), repeat=2))
        ]
        if len(keys) > most:
            return 0
        for key in keys:
            self.tables.layout_centres(key)
            if not self.random_points:
                self.tables.members(key)
        return len(keys)

    @property
    def num_stations(self) -> int:
        return self.random_points or self.station_x.shape[0]

    def reference(self, variable: str, hours: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray | float:
        """What a value of ``variable`` is a departure from before scaling: its climatology at the store times
        ``hours [B]`` on the flat grid points ``flat`` (all: ``[B, H * W]``; else ``[B, len(flat)]``), or, without a
        climatology, its mean (a float)."""
        if self.climatology is None:
            i = self.grid_variables.index(variable) if variable in self.grid_variables else None
            return float(self.mean[i]) if i is not None else float(self.station_mean)
        field = self.climatology[variable][self.hour_index[hours]]  # [B, H * W]
        if flat is None:
            return field
        return np.take_along_axis(field, np.broadcast_to(flat, (len(field), flat.shape[-1])), 1)

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator,
        split: Split,
        pick: np.ndarray | None = None,
        share: float | None = None,
        target_x: np.ndarray | None = None,
        training: bool = False,
    ) -> Batch:
        """``batch_size`` tasks at random hours of ``split``: context ``grid [B, G, Dy]`` and ``stations``, targets.

        ``pick [B]`` fixes the hours (indices into the split), ``share`` the stations' context share, and
        ``target_x [P, 2]`` replaces the station targets by those points (values unknown: ``y = 0``). Each task's
        coarse lattice follows ``layouts[split.name]`` (``layouts["train"]`` for other names); ``training`` tasks
        lose parts of it as ``coverage_dropout`` draws, the others the sides ``eval_trim`` names.
        """
        b, s = batch_size, self.num_stations
        if pick is None:
            pick = torch.randint(len(split.target_time), (b,), generator=generator).numpy()
        low, high = self.context_fraction if share is None else (share, share)
        share_b = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64)
        fixed = self.num_targets if share is None else None  # a fixed number of held-out targets
        n_ctx = np.minimum(np.floor(share_b.numpy() * s).astype(np.int64), s - (fixed or 1))  # >= 1 target
        perm = torch.argsort(torch.rand(b, s, generator=generator), dim=1).numpy()  # [B, S] random station order
        if self.random_points:  # distinct fine grid points per task: [B, S] flat indices and their coordinates
            size = self.shape[0] * self.shape[1]
            flat = torch.stack([torch.randperm(size, generator=generator)[:s] for _ in range(b)]).numpy()
            points_x = np.stack([self.lat[flat // self.shape[1]], self.lon[flat % self.shape[1]]], -1)
            points_x = points_x.astype(np.float32)
        else:
            flat, points_x = np.broadcast_to(self.station_flat, (b, s)), np.broadcast_to(self.station_x, (b, s, 2))
        factors, offset = self.layouts.get(split.name, self.layouts["train"])
        layout = BlockLayout(*draw_layouts(b, factors, offset, generator), self.shape, self.wrap_lon)
        # The grid variables are read with the tasks of each layout side by side (``order``), so that the block
        # sums take each layout's fields as one slice; their results go back to the tasks' order (``back``).
        order, grouped = layout.grouped()
        back = np.argsort(order)

        t_target, t_grid = split.target_time[pick], split.grid_time[pick]
        requests = [(v, t_grid[order]) for v in self.grid_variables] + [(self.station_variable, t_target)]
        baseline_in_grid = self.station_variable in self.grid_variables
        if not baseline_in_grid:
            requests.append((self.station_variable, t_grid))
        fields = [f.reshape(b, -1) for f in self.cache.read(requests)]  # [B, H * W] each
        n_grid = len(self.grid_variables)
        # The station variable at the grid's hour: one of the grid fields (grouped order), or read in task order.
        if baseline_in_grid:
            station_at_grid_time = fields[self.grid_variables.index(self.station_variable)]
            station_layout, station_order, station_back = grouped, order, back
        else:
            station_at_grid_time = fields[-1]
            station_layout, station_order, station_back = layout, slice(None), slice(None)
        # Departures from each grid point's own reference (its climatology at that hour, or the variable's mean)
        # before the blocks average them: a block's share of sea or hill then no longer shifts its value.
        if n_grid == 0:  # stations only (grid_variables: []): no gridded source
            coarse = np.zeros((b, layout.size, 0))
        else:
            if self.climatology is None:  # a constant reference per variable: averaged first, subtracted after
                grid_fields = fields[0][..., None] if n_grid == 1 else np.stack(fields[:n_grid], -1)
                shift = np.array([self.reference(v, t_grid) for v in self.grid_variables])  # [V]
            else:
                references = [self.reference(v, t_grid[order]) for v in self.grid_variables]
                grid_fields = np.stack([f - r for f, r in zip(fields[:n_grid], references, strict=True)], -1)
                shift = np.zeros(n_grid)
            coarse = grouped.fast_means(grid_fields.reshape(b, *self.shape, n_grid))[back] - shift  # [B, G, V]
        # The station variable's block means at the grid time, in its units, for the stations' blocks only [B, S].
        if self.random_points:  # other points in every task: the layout's block means, read at each task's points
            blocks = np.take_along_axis(station_layout.labels, flat[station_order], 1)  # [B, S]
            means = station_layout.means(station_at_grid_time[..., None])[..., 0]
            coarse_station = np.take_along_axis(means, blocks, 1)[station_back]
        else:  # the stations' blocks only, from tables cached per layout
            coarse_station = self.tables.point_means(station_layout, station_at_grid_time)[station_back]

        # On-the-grid context: every block of the task's layout, at the mean of its points' coordinates,
        # normalised; blocks with a NaN in any variable (or padding beyond a task's block count) are masked out.
        grid_x = self.tables.centres(layout, np.float32)  # [B, G, 2]
        y_grid = (coarse / self.std).astype(np.float32)
        grid_ok = np.isfinite(y_grid).all(-1) & layout.exists
        if training and self.coverage_dropout is not None:  # drawn last: the draws above stay as they were
            grid_ok &= dropout_mask(layout, self.coverage_dropout, generator, *self.ascending)
        elif not training and self.eval_trim is not None:
            grid_ok &= trim_mask(layout, np.asarray(self.eval_trim), *self.ascending)
        if self.hour_of_day is not None:  # (sin, cos) of the target's hour of day on every block: [B, G, 2]
            angle = 2 * np.pi * self.hour_of_day[t_target] / 24.0
            clock = np.stack([np.sin(angle), np.cos(angle)], -1).astype(np.float32)
            y_grid = np.concatenate([y_grid, np.broadcast_to(clock[:, None], (*y_grid.shape[:2], 2))], -1)
        station_value = np.take_along_axis(fields[n_grid], flat, 1)  # [B, S]
        reference = self.reference(self.station_variable, t_target, flat)
        station_y = (station_value - reference) / self.station_std  # [B, S]
        station_ok = np.isfinite(station_y)
        # Normalised error of predicting each station by its coarse cell's value (not its departure).
        baseline_err = (coarse_station - station_value) / self.station_std

        # Off-the-grid context: the first n_ctx stations of each task's order; targets: the rest, or every station.
        width_c = max(int(n_ctx.max()), 1)
        idx_c = perm[:, :width_c]
        mask_c = (np.arange(width_c) < n_ctx[:, None]) & np.take_along_axis(station_ok, idx_c, 1)
        if fixed:
            idx_t = np.take_along_axis(perm, n_ctx[:, None] + np.arange(fixed), 1)
            mask_t = np.ones((b, fixed), dtype=bool)
        elif self.targets == "held_out" and share is None:
            width_t = s - int(n_ctx.min())
            pos = n_ctx[:, None] + np.arange(width_t)
            idx_t = np.take_along_axis(perm, np.minimum(pos, s - 1), 1)
            mask_t = pos < s
        else:
            idx_t = np.broadcast_to(np.arange(s), (b, s))
            mask_t = np.ones((b, s), dtype=bool)
        mask_t = mask_t & np.take_along_axis(station_ok, idx_t, 1)

        context = {}
        if y_grid.shape[-1]:  # no grid variables (stations-only tasks): no "grid" source
            context["grid"] = masked_observations(
                torch.from_numpy(np.where(grid_ok[..., None], grid_x, np.float32(0.0))),
                y_grid,
                grid_ok,
                "context['grid']",
            )
        context["stations"] = masked_observations(
            torch.from_numpy(np.take_along_axis(points_x, idx_c[..., None], 1)),
            np.take_along_axis(station_y, idx_c, 1)[..., None],
            mask_c,
            "context['stations']",
        )
        extras = {
            "target_scale": torch.full((b,), float(self.station_std)),
            "hour": torch.from_numpy(t_target.astype(np.int64)),
        }
        if split.offset_time is not None:  # forecast tasks: the stations over the context hours and at each lead
            chosen = np.arange(width_c) < n_ctx[:, None]
            draws = {"flat": flat, "points": points_x, "idx_c": idx_c, "chosen": chosen, "coarse": coarse_station}
            held_out = self.targets == "held_out" and share is None
            return forecast_batch(self, split, pick, draws, context, extras, held_out)
        if target_x is not None:
            p = len(target_x)
            x_t = torch.from_numpy(np.ascontiguousarray(target_x, dtype=np.float32)).expand(b, p, 2)
            target = masked_observations(x_t, np.zeros((b, p, 1), np.float32), np.ones((b, p), bool), "target")
            return Batch(context, target, extras)
        y_t = np.take_along_axis(station_y, idx_t, 1)
        coarse_sq_err = np.where(mask_t, np.take_along_axis(baseline_err, idx_t, 1), 0.0) ** 2  # [B, Nt]
        x_t = np.take_along_axis(points_x, idx_t[..., None], 1)
        target = masked_observations(torch.from_numpy(x_t), y_t[..., None], mask_t, "target")
        extras["coarse_sq_err"] = torch.from_numpy(np.nan_to_num(coarse_sq_err).astype(np.float32))
        is_context = np.zeros((b, s), dtype=bool)
        np.put_along_axis(is_context, idx_c, mask_c, axis=1)  # [B, S] by station
        extras["is_context"] = torch.from_numpy(np.take_along_axis(is_context, idx_t, 1) & mask_t)  # [B, Nt]
        return Batch(context, target, extras)


class SplitTask:
    """The ``Task`` interface (``sample(batch_size, generator)``) of one split, for the shared task streams;
    ``tasks_per_read`` tasks in a row share an hour (one read), each with its own draws."""

    def __init__(self, task: StationReanalysisTask, split: Split, tasks_per_read: int = 1) -> None:
        self.task, self.split, self.tasks_per_read = task, split, tasks_per_read

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        pick = read_draws(len(self.split.target_time), batch_size, generator, self.tasks_per_read)
        return self.task.sample(batch_size, generator, self.split, pick, training=self.split.name == "train")


class HourSet(Dataset):
    """Every ``stride``-th hour of a split once, in order, ``draws`` tasks in a row per hour (each its own context
    draw), ``batch_size`` tasks a batch; batch ``i`` is drawn from the generator seeded with ``(seed, tag, i)``."""

    def __init__(
        self,
        task: StationReanalysisTask,
        split: Split,
        batch_size: int,
        seed: int,
        tag: str,
        draws: int = 1,
        share: float | None = None,
        target_x: np.ndarray | None = None,
        stride: int = 1,
    ) -> None:
        self.task, self.split, self.batch_size, self.seed, self.tag = task, split, batch_size, seed, tag
        self.hours = np.repeat(np.arange(0, len(split.target_time), stride), draws)  # [T / stride * draws]
        self.share, self.target_x = share, target_x

    def __len__(self) -> int:
        return -(-len(self.hours) // self.batch_size)

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.tag} set has {len(self)} batches; got index {index}.")
        pick = self.hours[index * self.batch_size : (index + 1) * self.batch_size]
        generator = generator_from(self.seed, self.tag, int(index))
        return self.task.sample(len(pick), generator, self.split, pick, self.share, self.target_x)
