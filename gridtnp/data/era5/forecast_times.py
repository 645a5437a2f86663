"""Forecast tasks of the station + reanalysis DataModule (``task.context_hours``, ``task.lead_hours``).

A forecast task starts at an initial hour ``t``: its context is the grid at ``t - time_offset_hours`` and the context
stations at every hour ``t + a .. t + b`` of ``context_hours = [a, b]``; its targets are every station at ``t + h``
for each ``h`` of ``lead_hours``. Every point carries its hours from ``t`` as its first input, ``x = (hours, lat,
lon)``, which the models embed like any coordinate (``NeuralProcess``'s ``time_dims``).

* ``Split``: a split's target hours (a forecast's initial hours) and grid hours, and a forecast's other hours.
* ``split_times``: the ``Split`` of each split's hours; for forecasts, the initial hours whose every context and
  target hour lies inside the split, with the store index of each of those hours.
* ``forecast_batch``: a batch of forecast tasks from the draws of ``StationReanalysisTask.sample``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

from gridtnp.batch import Batch, Observations, declare_extras
from gridtnp.data.era5.forecast_hours import forecast_offsets, initial_hours
from gridtnp.data.era5.station_options import StationPredictConfig, StationTaskConfig
from gridtnp.data.layout import DataError
from gridtnp.data.store_datamodule import masked_observations
from gridtnp.registry import ConfigError

declare_extras(
    "StationReanalysisDataModule",
    {"lead_hours": ("[B, Nt]", "hours from the task's initial hour to each target's hour: the lead_<h>h/ metrics")},
)


class Split:
    """Time steps of one split: target times (a forecast's initial times) and the grid times ``time_offset_hours``
    earlier, ``[T]`` each; ``hours``: every hour of the split with grid data (the climatology's hours)."""

    def __init__(self, name: str, target_time: np.ndarray, grid_time: np.ndarray, hours: np.ndarray | None = None):
        self.name, self.target_time, self.grid_time = name, target_time, grid_time
        self.hours = target_time if hours is None else hours
        # Forecast tasks (``split_times``): the store index [T, O] of each context and lead hour, those hours.
        self.offset_time: np.ndarray | None = None
        self.offset_hours: list[int] = []
        self.window = self.grid_offset = 0


def check_forecast_predict(task: StationTaskConfig, predict: StationPredictConfig) -> None:
    """A ConfigError for a prediction grid (``predict.resolution``) with forecast tasks: they predict at stations."""
    if task.forecast and predict.resolution is not None:
        raise ConfigError("predict.resolution is for same-hour tasks; forecast tasks (task.lead_hours) predict at "
                          "the stations: leave predict.resolution null.")  # fmt: skip


def split_times(
    time: pd.DatetimeIndex, hours: dict[str, np.ndarray], task: StationTaskConfig, where: Callable[[str], str]
) -> dict[str, Split]:
    """``{split: Split}`` from each split's store indices ``hours [T]``: the hours with grid data
    ``time_offset_hours`` earlier and, for forecast tasks, the initial hours ``t`` whose context hours and lead hours
    are all hours of the split; ``where(split)`` names the split's dates and the store in errors."""
    splits, shift = {}, task.time_offset_hours
    for name, target_time in hours.items():
        grid_time = time.get_indexer(time[target_time] - pd.Timedelta(hours=shift))
        ok = grid_time >= 0
        if not ok.any():
            raise DataError(f"{where(name)}: no hour has grid data {shift} h earlier.")
        if not task.forecast:
            splits[name] = Split(name, target_time[ok], grid_time[ok])
            continue
        a, b = task.context_hours
        offsets = forecast_offsets(task)
        at, inside = initial_hours(time, target_time, task, where(name), ok)  # [T, O], [T]
        split = Split(name, target_time[inside], grid_time[inside], hours=target_time[ok])
        split.offset_time, split.offset_hours, split.window, split.grid_offset = at[inside], offsets, b - a + 1, shift
        splits[name] = split
    return splits


def forecast_batch(
    task: Any,
    split: Split,
    pick: np.ndarray,
    draws: dict[str, np.ndarray],
    context: dict[str, Observations],
    extras: dict[str, torch.Tensor],
    held_out: bool,
) -> Batch:
    """Forecast tasks at the initial hours ``split.target_time[pick] [B]`` (``task``: a ``StationReanalysisTask``).

    ``draws``: the same-hour task's ``flat [B, S]`` grid points and ``points [B, S, 2]`` locations of the stations,
    ``idx_c [B, Nc]`` and ``chosen [B, Nc]`` the context stations, ``coarse [B, S]`` each station's coarse cell at the
    grid hour. Context ``stations``: ``x [B, K * Nc, 3]`` over the ``K`` context hours (hour-major); targets: every
    station at each lead, ``x [B, L * S, 3]`` (lead-major; ``held_out``: the context stations masked out).
    """
    flat, points, idx_c, chosen = draws["flat"], draws["points"], draws["idx_c"], draws["chosen"]
    times, hours, k = split.offset_time[pick], np.asarray(split.offset_hours, np.float32), split.window
    b, s = flat.shape
    variable = task.station_variable
    fields = task.cache.read([(variable, times[:, j]) for j in range(times.shape[1])])
    y = np.stack(
        [
            (np.take_along_axis(f.reshape(b, -1), flat, 1) - task.reference(variable, times[:, j], flat))
            / task.station_std
            for j, f in enumerate(fields)
        ],
        1,
    )  # [B, O, S] departures (or anomalies from the mean), normalised
    ok = np.isfinite(y)
    values = np.stack([np.take_along_axis(f.reshape(b, -1), flat, 1) for f in fields[k:]], 1)  # [B, L, S]

    def located(offsets: np.ndarray, station_x: np.ndarray) -> torch.Tensor:
        """``(hours, lat, lon)`` of the stations ``station_x [B, N, 2]`` at each of ``offsets [O]``: ``[B, O*N, 3]``."""
        o, n = len(offsets), station_x.shape[1]
        time = np.broadcast_to(offsets[None, :, None, None], (b, o, n, 1))
        space = np.broadcast_to(station_x[:, None], (b, o, n, 2))
        return torch.from_numpy(np.concatenate([time, space], -1).reshape(b, o * n, 3).astype(np.float32))

    window = np.broadcast_to(idx_c[:, None], (b, k, idx_c.shape[1]))
    mask_c = chosen[:, None] & np.take_along_axis(ok[:, :k], window, 2)  # [B, K, Nc]
    y_c = np.take_along_axis(y[:, :k], window, 2)[..., None].reshape(b, -1, 1)
    x_c = located(hours[:k], np.take_along_axis(points, idx_c[..., None], 1))
    out = {"grid": _with_hours(context["grid"], -float(split.grid_offset))} if "grid" in context else {}
    out["stations"] = masked_observations(x_c, y_c, mask_c.reshape(b, -1), "context['stations']")

    in_context = np.zeros((b, s), dtype=bool)
    np.put_along_axis(in_context, idx_c, chosen & mask_c.any(1), axis=1)  # [B, S] the station reported in the window
    mask_t = ok[:, k:] & ~(held_out & in_context[:, None])  # [B, L, S]
    x_t = located(hours[k:], points)
    target = masked_observations(x_t, y[:, k:].reshape(b, -1, 1), mask_t.reshape(b, -1), "target")
    coarse_err = np.where(mask_t, (draws["coarse"][:, None] - values) / task.station_std, 0.0) ** 2
    extras = {
        **extras,
        "coarse_sq_err": torch.from_numpy(np.nan_to_num(coarse_err).reshape(b, -1).astype(np.float32)),
        "is_context": torch.from_numpy((in_context[:, None] & mask_t).reshape(b, -1)),
        "lead_hours": torch.from_numpy(np.repeat(hours[k:], s)[None].repeat(b, 0)),
    }
    return Batch(out, target, extras)


def _with_hours(obs: Observations, hours: float) -> Observations:
    """``obs`` with ``hours`` as a first input column: ``x [B, N, 2] -> [B, N, 3]``."""
    column = obs.x.new_full((*obs.x.shape[:-1], 1), hours)
    return Observations(torch.cat([column, obs.x], -1), obs.y, obs.mask, obs.name)
