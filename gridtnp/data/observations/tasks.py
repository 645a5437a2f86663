"""The task sampler of ``ObservationDataModule``: the station task's coarse grid context, observed reports at the
stations.

* ``held_out_stations(ids, share, seed) -> [S] bool``: a fixed split by station identifier (a seeded hash of each
  identifier below ``share``), the same whichever other stations a file holds.
* ``ObservationTask``: a ``StationReanalysisTask`` whose station values are reports (``HourlyObservations``) at
  the stations' own coordinates; its ``sample`` builds the ``"grid"`` context through the station task and puts
  the reports of the hour in the ``"stations"`` context and the targets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from gridtnp.batch import Batch
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.era5.station_tasks import Split, StationReanalysisTask
from gridtnp.data.observations.join import HourlyObservations
from gridtnp.data.store_datamodule import masked_observations

#: Largest ``B x Nt x G`` distance table built at once when finding each target's nearest coarse block.
_NEAREST_CHUNK = 1 << 24


def held_out_stations(station_ids: Sequence[str], share: float, seed: int) -> np.ndarray:
    """``[S]`` bool: a station is held out when the hash of ``(seed, identifier)``, as a number in [0, 1), is below
    ``share``: about ``share`` of the stations, fixed by identifier, never by report."""
    draws = [hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest() for s in station_ids]  # per station
    return np.array([int.from_bytes(d, "big") / 2.0**64 for d in draws], dtype=np.float64) < share


def nearest_block(target_x: np.ndarray, grid_x: np.ndarray, grid_ok: np.ndarray) -> np.ndarray:
    """``[B, Nt]`` index of the nearest valid block centre ``grid_x [B, G, 2]`` (``grid_ok [B, G]``) to each of
    ``target_x [B, Nt, 2]`` (squared degrees, longitude scaled by the cosine of latitude)."""
    b, nt = target_x.shape[:2]
    g = grid_x.shape[1]
    out = np.zeros((b, nt), dtype=np.int64)
    step = max(1, _NEAREST_CHUNK // max(b * g, 1))
    scale = np.cos(np.deg2rad(target_x[..., :1]))  # [B, Nt, 1]
    for start in range(0, nt, step):  # chunks of targets bound the memory, not a loop over points
        part = slice(start, start + step)
        d = target_x[:, part, None, :] - grid_x[:, None]  # [B, n, G, 2]
        d2 = d[..., 0] ** 2 + (d[..., 1] * scale[:, part]) ** 2
        out[:, part] = np.argmin(np.where(grid_ok[:, None], d2, np.inf), -1)
    return out


def _first(order: np.ndarray, start: np.ndarray, count: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(index [B, width], mask [B, width])``: ``order``'s entries ``start .. count - 1`` of each row, padded."""
    pos = start[:, None] + np.arange(max(width, 1))
    return np.take_along_axis(order, np.minimum(pos, order.shape[1] - 1), 1), pos < count[:, None]


class ObservationTask(StationReanalysisTask):
    """Station + reanalysis tasks whose station values are observed reports; see ``ObservationDataModule``."""

    def __init__(
        self,
        cache: ChunkCache,
        grid_variables: Sequence[str],
        station_variable: str,
        stats: dict[str, tuple[float, float]],
        coords: tuple[np.ndarray, np.ndarray],
        reports: HourlyObservations,
        held_out: np.ndarray,
        num_times: int,
        **station_task: object,
    ) -> None:
        stations = reports.stations
        index = np.stack([stations["lat_index"].to_numpy(np.int64), stations["lon_index"].to_numpy(np.int64)])
        super().__init__(cache, grid_variables, station_variable, stats, coords, index, **station_task)  # type: ignore[arg-type]
        # A report is at its station, not at the grid point its climatology and coarse block are read from.
        self.station_x = stations[["latitude", "longitude"]].to_numpy(np.float32)
        self.observed = ~np.asarray(held_out, dtype=bool)  # [S] stations that may be context
        self.rows = reports.row_of_hour(num_times)  # [T] row of ``values`` per store time, -1: no report
        column = reports.variables.index(station_variable)
        self.values = np.concatenate([reports.values[..., column], np.full((1, len(stations)), np.nan, np.float32)])

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
        """``batch_size`` tasks at hours ``pick [B]`` of ``split`` (random when None): the station task's
        ``"grid"`` context; ``"stations"``: reports of observed stations, ``[B, Nc]`` padded and masked.

        ``training`` (the training stream; its grids also lose parts under ``coverage_dropout``): a share
        ``~ U[context_fraction]`` of the observed stations that reported is context; targets are the other reporting
        observed stations (``held_out``) or all of them (``all``); held-out stations never appear. Otherwise every
        observed station that reported is context; targets are the held-out stations that reported (validation,
        test) or, with ``share`` given (predictions), every station in station order (``y = 0`` where there is no
        report) or ``target_x``.
        """
        b, s = batch_size, len(self.station_x)
        if pick is None:
            pick = torch.randint(len(split.target_time), (b,), generator=generator).numpy()
        base = super().sample(b, generator, split, pick, 0.0, target_x, training)
        hours = split.target_time[pick]
        reference = self.reference(self.station_variable, hours, self.station_flat)
        y = (self.values[self.rows[hours]] - reference) / self.station_std  # [B, S]; row -1: the NaN row
        reported = np.isfinite(y)
        eligible = reported & self.observed
        count = eligible.sum(1)
        if training:
            low, high = self.context_fraction
            share_b = (low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64)).numpy()
            n_ctx = np.clip(np.floor(share_b * count).astype(np.int64), 0, np.maximum(count - 1, 0))
            keys = torch.rand(b, s, generator=generator).numpy()
            order = np.argsort(np.where(eligible, keys, 2.0), axis=1, kind="stable")  # reporting observed first
            start = np.zeros(b, np.int64) if self.targets == "all" else n_ctx
            idx_t, mask_t = _first(order, start, count, int((count - start).max(initial=0)))
            is_context = mask_t & (start[:, None] + np.arange(idx_t.shape[1]) < n_ctx[:, None])
        else:
            order = np.argsort(~eligible, axis=1, kind="stable")
            n_ctx = count
            if share is not None:  # predictions: every station
                idx_t, mask_t = np.broadcast_to(np.arange(s), (b, s)), np.ones((b, s), dtype=bool)
                is_context = eligible
            else:
                held = reported & ~self.observed
                idx_t, mask_t = _first(np.argsort(~held, axis=1, kind="stable"), np.zeros(b, np.int64),
                                       held.sum(1), int(held.sum(1).max(initial=0)))  # fmt: skip
                is_context = np.zeros(mask_t.shape, dtype=bool)
        idx_c, mask_c = _first(order, np.zeros(b, np.int64), n_ctx, int(n_ctx.max(initial=0)))
        context = dict(base.context)
        context["stations"] = masked_observations(
            torch.from_numpy(self.station_x[idx_c]), np.take_along_axis(y, idx_c, 1)[..., None], mask_c,
            "context['stations']",
        )  # fmt: skip
        extras = {"target_scale": base.extras["target_scale"], "hour": base.extras["hour"]}
        if target_x is not None:
            return Batch(context, base.target, extras)
        y_t = np.take_along_axis(y, idx_t, 1)
        x_t = self.station_x[idx_t]  # [B, Nt, 2]
        # Targets are reporting stations (training, evaluation) or every station (predictions: y = 0 unreported).
        target = masked_observations(torch.from_numpy(x_t), np.nan_to_num(y_t)[..., None], mask_t, "target")
        extras["is_context"] = torch.from_numpy(np.ascontiguousarray(is_context & mask_t))
        if self.station_variable in self.grid_variables and "grid" in context:
            grid = context["grid"]
            column = self.grid_variables.index(self.station_variable)
            nearest = nearest_block(x_t, grid.x.numpy(), grid.mask.numpy())
            coarse = np.take_along_axis(grid.y[..., column].numpy(), nearest, 1)  # [B, Nt]
            err = np.where(mask_t & np.isfinite(y_t), coarse - np.nan_to_num(y_t), 0.0) ** 2
            extras["coarse_sq_err"] = torch.from_numpy(err.astype(np.float32))
        return Batch(context, target, extras)
