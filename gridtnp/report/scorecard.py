"""Several models scored on the same station tasks, beside the coarse-cell baseline: ``gridtnp report --compare``.

Each model's evaluation is a station Dataset on ``(time, station)`` (``Evaluation.physical``: ``mean``, ``std``,
``observed`` = ERA5 at the station locations, ``is_context``, ``baseline_sq_error``). Scores are over held-out
targets (stations not in that hour's context) unless named otherwise.

* ``Scored``: one model's name, Dataset and normalisation scale; ``check_same_tasks(entries)``: refuse models that
  were not scored on the same hours, stations and contexts.
* ``scores(entries)``: ``{model: {metric: value}}`` with the ``coarse cell`` row; ``station_rmse(entries)``:
  per-station held-out RMSE ``[M + 1, S]`` (the coarse cell last) and ``winners``.
* ``scorecard_html(entries)``: the physical and the normalised tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gridtnp.metrics import central_interval_halfwidth
from gridtnp.registry import ConfigError
from gridtnp.report.html_parts import html_table

BASELINE = "coarse cell"
Z90 = central_interval_halfwidth(0.9)


@dataclass
class Scored:
    """One model on the split: its ``name`` (the recipe's), ``physical`` station Dataset and ``scale``, the station
    variable's std (normalised units = physical / scale)."""

    name: str
    physical: Any
    scale: float

    def array(self, key: str) -> np.ndarray:
        return np.asarray(self.physical[key].values, dtype=np.float64)  # [T, S]

    @property
    def held_out(self) -> np.ndarray:
        """Valid targets not in their hour's context ``[T, S]``."""
        ok = np.isfinite(self.array("observed")) & np.isfinite(self.array("mean"))
        return ok & ~np.asarray(self.physical["is_context"].values).astype(bool)

    @property
    def context(self) -> np.ndarray:
        ok = np.isfinite(self.array("observed")) & np.isfinite(self.array("mean"))
        return ok & np.asarray(self.physical["is_context"].values).astype(bool)

    @property
    def error(self) -> np.ndarray:
        """Prediction - truth ``[T, S]`` in physical units (positive: too warm)."""
        return self.array("mean") - self.array("observed")

    @property
    def z(self) -> np.ndarray:
        """Standardised error (prediction - truth) / std ``[T, S]``, the same sign as ``error``."""
        return self.error / self.array("std")

    @property
    def loglik(self) -> np.ndarray:
        """Gaussian log density of the truth in normalised units (as ``gridtnp test``) ``[T, S]``."""
        return -0.5 * math.log(2 * math.pi) - np.log(self.array("std") / self.scale) - 0.5 * self.z**2


def check_same_tasks(entries: list[Scored]) -> None:
    """Raise ``ConfigError`` unless every model saw the same hours, stations, truth and context stations."""
    first = entries[0]
    for other in entries[1:]:
        same = (
            first.physical.sizes == other.physical.sizes
            and np.array_equal(first.physical["time"].values, other.physical["time"].values)
            and np.array_equal(first.physical["is_context"].values, other.physical["is_context"].values)
            and np.allclose(first.array("observed"), other.array("observed"), equal_nan=True, atol=1e-3)
        )
        if not same:
            raise ConfigError(
                f"--compare: {other.name!r} was scored on other tasks than {first.name!r} (hours, stations or context "
                "draws differ); compare checkpoints of the same DataModule settings (station list, splits, "
                "context_fraction, eval_stride), or pass the same --data.* overrides to both."
            )


def _mean(values: np.ndarray, where: np.ndarray) -> float:
    return float(values[where].mean()) if where.any() else float("nan")


def scores(entries: list[Scored]) -> dict[str, dict[str, float]]:
    """Per model (and the coarse cell, from the first model's ``baseline_sq_error``) the scorecard's metrics:
    physical (``rmse``, ``mae``, ``mean_std``, ``context_rmse``, ``rmse_skill``) and normalised (``loglik``,
    ``loglik_gain``, ``z2``, ``coverage90``)."""
    first = entries[0]
    keep = first.held_out
    base_sq = first.array("baseline_sq_error") if "baseline_sq_error" in first.physical else None
    base_rmse = math.sqrt(_mean(base_sq, keep)) if base_sq is not None else float("nan")
    # The coarse cell as a Gaussian: its value, one std for all targets (its own RMSE here, the best constant one).
    base_loglik = -0.5 * math.log(2 * math.pi * (base_rmse / first.scale) ** 2) - 0.5
    out: dict[str, dict[str, float]] = {}
    for entry in entries:
        err, held, ctx = entry.error, entry.held_out, entry.context
        rmse = math.sqrt(_mean(err**2, held))
        loglik = _mean(entry.loglik, held)
        out[entry.name] = {
            "rmse": rmse,
            "rmse_skill": 1.0 - rmse / base_rmse,
            "mae": _mean(np.abs(err), held),
            "mean_std": _mean(entry.array("std"), held),
            "context_rmse": math.sqrt(_mean(err**2, ctx)) if ctx.any() else float("nan"),
            "loglik": loglik,
            "loglik_gain": loglik - base_loglik,
            "z2": _mean(entry.z**2, held),
            "coverage90": _mean((np.abs(entry.z) <= Z90).astype(float), held),
            "targets": float(held.sum()),
        }
    out[BASELINE] = {"rmse": base_rmse, "rmse_skill": 0.0, "loglik": base_loglik, "loglik_gain": 0.0}
    if base_sq is not None:
        out[BASELINE]["mae"] = _mean(np.sqrt(base_sq), keep)
        out[BASELINE]["targets"] = float(keep.sum())
    return out


def station_rmse(entries: list[Scored]) -> np.ndarray:
    """Held-out RMSE of each station over the hours it was held out ``[M + 1, S]``: the models, then the coarse
    cell (NaN rows without the baseline, NaN where a station was never held out)."""
    keep = entries[0].held_out
    hours = keep.sum(0)
    rows = [np.where(keep, e.error**2, 0.0).sum(0) for e in entries]
    base = entries[0].array("baseline_sq_error") if "baseline_sq_error" in entries[0].physical else None
    rows.append(np.where(keep, base, 0.0).sum(0) if base is not None else np.full(keep.shape[1], np.nan))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(np.stack(rows) / np.where(hours > 0, hours, np.nan))


def winners(rmse: np.ndarray) -> np.ndarray:
    """Index of the lowest RMSE per station ``[S]`` (-1 where no row has a value)."""
    filled = np.where(np.isfinite(rmse), rmse, np.inf)
    best = filled.argmin(0)
    return np.where(np.isfinite(filled.min(0)), best, -1)


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def scorecard_html(entries: list[Scored], units: str) -> str:
    """The scorecard: a physical table (``units``) and a normalised one, each with its line of explanation."""
    table = scores(entries)
    won = winners(station_rmse(entries))
    names = [*(e.name for e in entries), BASELINE]
    classes = ["baseline" if n == BASELINE else "" for n in names]
    physical = [
        [
            n,
            _cell(table[n].get("rmse")),
            _cell(table[n].get("rmse_skill")),
            _cell(table[n].get("mae")),
            _cell(table[n].get("mean_std")),
            _cell(table[n].get("context_rmse")),
            str(int((won == i).sum())),
        ]
        for i, n in enumerate(names)
    ]
    normalised = [
        [
            n,
            _cell(table[n].get("loglik")),
            _cell(table[n].get("loglik_gain")),
            _cell(table[n].get("z2"), 2),
            _cell(table[n].get("coverage90"), 2),
        ]
        for n in names
    ]
    count = int(table[entries[0].name]["targets"])
    u = f" [{units}]" if units else ""
    head_p = [
        "model",
        f"held-out RMSE{u}",
        "RMSE skill vs coarse cell",
        f"held-out MAE{u}",
        f"mean predictive std{u}",
        f"context RMSE{u}",
        "stations won",
    ]
    head_n = ["model", "held-out log-likelihood", "log-likelihood gain vs coarse cell", "mean z^2", "90 % coverage"]
    return (
        f'<div id="scorecard">{html_table(head_p, physical, classes, "scorecard-physical")}'
        f"<p>Physical units, over {count:,} held-out targets (station-hours not in the context; truth: ERA5 at "
        "station locations). Skill = 1 - RMSE / RMSE of the coarse cell's value at the station (1: perfect, 0: no "
        "better than the coarse cell, below 0: worse). Stations won: lowest held-out RMSE over the split.</p>"
        f"{html_table(head_n, normalised, classes, 'scorecard-normalised')}"
        "<p>Normalised units (the target variable divided by its training std, as <code>gridtnp test</code> "
        "reports): log-likelihood per held-out target (higher is better); gain = the model's minus that of the "
        "coarse cell as a Gaussian with one std for every target (its own RMSE here, the best constant std it could "
        "have), in nats per target; mean z^2 (1 when the std is calibrated, above 1 over-confident) and the share "
        "of targets inside the central 90 % interval (0.90 when calibrated).</p></div>"
    )
