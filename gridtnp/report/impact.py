"""Observation impact: how much the held-out error and the predictive std at the other stations drop when one more
station is added to the context. A neural process predicts from any context in one forward pass, so each
candidate station costs one forward over a set of hours (several candidates share a forward as a larger batch).

* ``stack_tasks(tasks)``: batches of one task (``gridtnp.report.plots.task_batch``) as one batch, padded.
* ``with_station(batch, station, source)``: the batch with target ``station`` appended to context ``source``.
* ``observation_impact(module, batch, source)``: per station ``rmse_drop``, ``std_drop`` (normalised units),
  ``hours`` (where the station was held out, so it could be added).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gridtnp.batch import Batch, Observations


@dataclass
class Impact:
    """Per station ``[S]``: the drop of the other held-out stations' RMSE and of their mean predictive std when the
    station is added to the context, in normalised units (NaN where it was never held out), and ``hours``, the
    hours it was held out in; ``times``: the hours (store indices) used."""

    rmse_drop: np.ndarray
    std_drop: np.ndarray
    hours: np.ndarray
    times: np.ndarray


def _pad(t: Tensor, n: int) -> Tensor:
    """``t [1, N, ...]`` padded with zeros (False) to ``[1, n, ...]``."""
    if t.shape[1] == n:
        return t
    pad = torch.zeros((1, n - t.shape[1], *t.shape[2:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], 1)


def stack_tasks(tasks: list[Batch]) -> Batch:
    """Batches of one task each as one batch ``[len(tasks), ...]``, every source padded to its widest task."""

    def stacked(observations: list[Observations]) -> Observations:
        n = max(o.x.shape[1] for o in observations)
        return Observations(
            torch.cat([_pad(o.x, n) for o in observations]),
            torch.cat([_pad(o.y, n) for o in observations]),
            torch.cat([_pad(o.mask, n) for o in observations]),
            observations[0].name,
        )

    context = {name: stacked([t.context[name] for t in tasks]) for name in tasks[0].context}
    target = stacked([t.target for t in tasks])
    extras = {
        k: torch.cat([_pad(t.extras[k], target.x.shape[1]) if t.extras[k].dim() > 1 else t.extras[k] for t in tasks])
        for k in tasks[0].extras
    }
    return Batch(context, target, extras)


def with_stations(batch: Batch, stations: Tensor, source: str) -> Batch:
    """``batch [H]`` repeated for each of ``stations [K]`` (candidate-major: task ``k * H + h``), target
    ``stations[k]`` appended to context ``source`` where it is a valid held-out target of that hour (masked out
    elsewhere, so that the task is the original one)."""
    h, k = batch.batch_size, len(stations)
    target, obs = batch.target, batch.context[source]
    held = target.valid() & ~batch.extras["is_context"].bool()  # [H, S]
    x_new = target.x[:, stations].transpose(0, 1).reshape(k * h, 1, -1)  # [K * H, 1, Dx]
    y_new = target.y[:, stations].transpose(0, 1).reshape(k * h, 1, -1)
    m_new = held[:, stations].transpose(0, 1).reshape(k * h, 1)
    y_new = torch.where(m_new[..., None], y_new, torch.zeros_like(y_new))  # masked points hold zeros

    def repeat(t: Tensor) -> Tensor:
        return t.repeat(k, *([1] * (t.dim() - 1)))

    context = {
        name: Observations(repeat(o.x), repeat(o.y), repeat(o.mask), o.name) for name, o in batch.context.items()
    }
    context[source] = Observations(
        torch.cat([repeat(obs.x), x_new], 1),
        torch.cat([repeat(obs.y), y_new], 1),
        torch.cat([repeat(obs.mask), m_new], 1),
        obs.name,
    )
    extras = {name: repeat(v) for name, v in batch.extras.items()}
    return Batch(context, Observations(repeat(target.x), repeat(target.y), repeat(target.mask), target.name), extras)


def _predict(module: Any, batch: Batch) -> tuple[Tensor, Tensor]:
    """Predictive mean and (calibrated) std ``[B, S]`` of the first output."""
    with torch.no_grad():
        dist = module(batch)
        calibrate = getattr(module, "calibrate", None)
        std = calibrate(dist, batch).stddev if callable(calibrate) else dist.stddev
    return dist.mean[..., 0].float(), std[..., 0].float()


def observation_impact(module: Any, batch: Batch, source: str = "stations", max_tasks: int = 32) -> Impact:
    """For every station held out in some hour of ``batch`` (targets: every station, ``is_context`` in the extras):
    the other held-out stations' RMSE and mean std without it minus with it in the context (positive: the station
    helps), over the hours it was held out in; up to ``max_tasks`` tasks (candidates x hours) a forward."""
    target = batch.target
    if "is_context" not in batch.extras or source not in batch.context:
        raise ValueError(f"observation impact needs a station context {source!r} and is_context in the extras")
    y = target.y[..., 0].float()  # [H, S]
    held = target.valid() & ~batch.extras["is_context"].bool()  # [H, S]
    mean, std = _predict(module, batch)
    base_sq = torch.where(held, (mean - y) ** 2, 0.0)
    base_std = torch.where(held, std, 0.0)
    h, s = held.shape
    candidates = torch.nonzero(held.any(0)).flatten()
    rmse_drop, std_drop = np.full(s, np.nan), np.full(s, np.nan)
    per_forward = max(1, max_tasks // h)
    arange = torch.arange(s, device=y.device)
    for start in range(0, len(candidates), per_forward):
        chunk = candidates[start : start + per_forward]  # [K]
        k = len(chunk)
        m, sd = _predict(module, with_stations(batch, chunk, source))
        m, sd = m.reshape(k, h, s), sd.reshape(k, h, s)
        # The other held-out stations, in the hours the candidate was held out (and so could be added).
        others = held[None] & (arange[None, None] != chunk[:, None, None]) & held[:, chunk].T[:, :, None]  # [K, H, S]
        n = others.sum((1, 2)).clamp(min=1)
        before = torch.sqrt((base_sq[None] * others).sum((1, 2)) / n)
        after = torch.sqrt(torch.where(others, (m - y[None]) ** 2, 0.0).sum((1, 2)) / n)
        std_before = (base_std[None] * others).sum((1, 2)) / n
        std_after = torch.where(others, sd, 0.0).sum((1, 2)) / n
        index = chunk.cpu().numpy()
        rmse_drop[index] = (before - after).cpu().numpy()
        std_drop[index] = (std_before - std_after).cpu().numpy()
    hours = held.sum(0).cpu().numpy()
    times = batch.extras["hour"].cpu().numpy() if "hour" in batch.extras else np.arange(h)
    return Impact(rmse_drop, std_drop, hours, times)
