"""Station placement: where K new stations would most reduce a model's predictive variance over a region.

Greedy, as DeepSensor's: at each of K rounds every remaining candidate site is added to the context as one more
station, and the candidate whose addition lowers the region's mean predictive variance the most (averaged over a
set of hours) is kept for the next rounds. A neural process's predictive std depends on the context values, so a
candidate needs a value: it is the model's own predictive mean there given the context so far (the
pseudo-observation DeepSensor uses; for a Gaussian process the variance does not depend on it at all). The
predictive variance is the model's expected squared error of its mean, so the gain is also the drop in expected
squared error. Candidates are evaluated as tasks stacked along the batch dimension, ``max_tasks`` tasks
(candidates x hours) a forward.

* ``greedy_placement(module, context, region, candidates, count)``: the ``Placement`` (sites in order, gains).
* ``box_points(lower, upper, shape)``: a regular grid of points ``[N, Dx]`` over a box (candidates or region).
* ``read_candidates(path, coords)``: candidate sites ``[C, Dx]`` (and their names) from a CSV file.
* ``placement_table(placement, coords, names, scale)``: the chosen sites as a ``pandas.DataFrame``.
* ``squared_units(units)``: the units of a variance (``K²``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gridtnp.batch import Batch, Observations
from gridtnp.models.neural_process import TARGET_CHUNK
from gridtnp.registry import ConfigError

#: Other names a candidates file may give the geographic columns.
ALIASES = {"latitude": ("latitude", "lat"), "longitude": ("longitude", "lon", "long")}


@dataclass
class Placement:
    """The greedy choice: ``index [K]`` (rows of the candidates), ``sites [K, Dx]``, ``gains [K]`` (drop of the
    region's mean predictive variance at each round, normalised units), ``variance [K + 1]`` (the region's mean
    predictive variance before the first round and after each), ``first_gains [C]`` (every candidate's gain in
    the first round), ``std_before`` and ``std_after [M]`` (predictive std at each region point, mean over hours,
    before and after the K sites)."""

    index: np.ndarray
    sites: np.ndarray
    gains: np.ndarray
    variance: np.ndarray
    first_gains: np.ndarray
    std_before: np.ndarray
    std_after: np.ndarray


def predictive(module: Any, context: Mapping[str, Observations], x: Tensor, target_chunk: int) -> tuple[Tensor, Tensor]:
    """Predictive mean and variance ``[B, N, Dy]`` at ``x [B, N, Dx]`` given ``context`` (calibrated std where
    ``module`` has a variance calibration), targets decoded ``target_chunk`` points (over all tasks) at a time."""
    model = getattr(module, "model", module)
    chunked = getattr(model, "forward_chunked", None)
    chunk = max(1, target_chunk // max(x.shape[0], 1))
    dist = chunked(dict(context), x, chunk) if chunked is not None else model(dict(context), x)
    calibrate = getattr(module, "calibrate", None)
    if callable(calibrate):
        dist = calibrate(dist, Batch(dict(context), Observations(x)))
    return dist.mean, dist.stddev**2


def _repeat(obs: Observations, k: int) -> Observations:
    """``obs [H, ...]`` repeated ``k`` times along the batch, candidate-major (task ``i * H + h``)."""
    return Observations(obs.x.repeat(k, 1, 1), obs.y.repeat(k, 1, 1), obs.mask.repeat(k, 1), obs.name)


def with_sites(context: Mapping[str, Observations], source: str, x: Tensor, y: Tensor) -> dict[str, Observations]:
    """``context [H]`` repeated for each of ``K`` sites (candidate-major: task ``k * H + h``), site ``k`` at
    ``x [K, Dx]`` with value ``y [K, H, Dy]`` appended to ``source``."""
    k, h = x.shape[0], y.shape[1]
    obs = context[source]
    out = {name: _repeat(o, k) for name, o in context.items()}
    x_new = x[:, None, None, :].expand(k, h, 1, x.shape[-1]).reshape(k * h, 1, -1).to(obs.x)
    y_new = y.reshape(k * h, 1, -1).to(obs.y)
    mask = torch.ones(k * h, 1, dtype=torch.bool, device=obs.x.device)
    rep = out[source]
    out[source] = Observations(
        torch.cat([rep.x, x_new], 1), torch.cat([rep.y, y_new], 1), torch.cat([rep.mask, mask], 1), obs.name
    )
    return out


def _source(module: Any, context: Mapping[str, Observations], source: str | None) -> str:
    """The context source new stations join: ``source``, else the model's target source, else the only one."""
    if source is None:
        source = getattr(getattr(module, "model", module), "target_source", None)
        if source is None and len(context) == 1:
            source = next(iter(context))
    if source is None or source not in context:
        raise ConfigError(
            f"placement: new stations join a context source; {'none was named' if source is None else repr(source)} "
            f"is not one of the context's sources {list(context)}: pass source= (--source) naming one."
        )
    return source


@torch.no_grad()
def greedy_placement(
    module: Any,
    context: Mapping[str, Observations],
    region: Tensor,
    candidates: Tensor,
    count: int,
    source: str | None = None,
    max_tasks: int = 64,
    target_chunk: int = TARGET_CHUNK,
    progress: Callable[[int, int, float], None] | None = None,
) -> Placement:
    """``count`` sites from ``candidates [C, Dx]`` chosen greedily by the drop of the mean predictive variance at
    the points ``region [M, Dx]``, averaged over the ``H`` tasks (hours) of ``context`` (``[H, N, ...]`` per
    source); each candidate joins context ``source`` (default: the model's target source, or the only one) with
    the model's predictive mean there as its value. ``module`` is a ``NeuralProcessModule``, a ``NeuralProcess``
    or any ``model(context, xt) -> Distribution``; ``max_tasks`` (candidates x hours) are evaluated a forward;
    ``progress(round, candidate, gain)`` is called after each round."""
    if count < 1 or count > len(candidates):
        raise ConfigError(f"placement: count {count}: expected 1 to the number of candidates ({len(candidates)}).")
    source = _source(module, context, source)
    model = getattr(module, "model", module)
    was_training = model.training if isinstance(model, torch.nn.Module) else False
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        return _greedy(module, dict(context), region, candidates, count, source, max_tasks, target_chunk, progress)
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)


def _greedy(
    module: Any,
    context: dict[str, Observations],
    region: Tensor,
    candidates: Tensor,
    count: int,
    source: str,
    max_tasks: int,
    target_chunk: int,
    progress: Callable[[int, int, float], None] | None,
) -> Placement:
    """``greedy_placement`` once its arguments are checked (model in eval mode, no gradients)."""
    h = context[source].x.shape[0]
    device = context[source].x.device
    region, candidates = region.to(device), candidates.to(device)
    region_h = region.expand(h, -1, -1)  # [H, M, Dx]
    per_forward = max(1, max_tasks // h)
    remaining = torch.ones(len(candidates), dtype=torch.bool, device=device)
    _, var = predictive(module, context, region_h, target_chunk)
    std_before = var.float().sqrt().mean((0, 2)).cpu().numpy()
    variance = [float(var.double().mean())]
    chosen, gains, first_gains = [], [], np.full(len(candidates), np.nan)
    for round_ in range(count):
        left = torch.nonzero(remaining).flatten()  # [R]
        pseudo, _ = predictive(module, context, candidates[left].expand(h, -1, -1), target_chunk)  # [H, R, Dy]
        if pseudo.shape[-1] != context[source].y.shape[-1]:
            raise ConfigError(
                f"placement: the model predicts {pseudo.shape[-1]} outputs but context {source!r} holds "
                f"{context[source].y.shape[-1]}; new stations join a source of the predicted variable (--source)."
            )
        after = torch.empty(len(left), dtype=torch.float64, device=device)
        for start in range(0, len(left), per_forward):
            part = slice(start, start + per_forward)
            k = len(left[part])
            tried = with_sites(context, source, candidates[left[part]], pseudo[:, part].transpose(0, 1))
            _, v = predictive(module, tried, region_h.repeat(k, 1, 1), target_chunk)  # [K * H, M, Dy]
            after[part] = v.double().reshape(k, -1).mean(1)
        gain = variance[-1] - after  # [R]
        if round_ == 0:
            first_gains[left.cpu().numpy()] = gain.cpu().numpy()
        best = int(torch.argmax(gain))
        site = int(left[best])
        context = with_sites(context, source, candidates[site : site + 1], pseudo[:, best : best + 1].transpose(0, 1))
        remaining[site] = False
        chosen.append(site)
        gains.append(float(gain[best]))
        variance.append(float(after[best]))
        if progress is not None:
            progress(round_ + 1, site, gains[-1])
    _, var = predictive(module, context, region_h, target_chunk)
    index = np.array(chosen)
    return Placement(
        index=index,
        sites=candidates[index].cpu().numpy(),
        gains=np.array(gains),
        variance=np.array(variance),
        first_gains=first_gains,
        std_before=std_before,
        std_after=var.float().sqrt().mean((0, 2)).cpu().numpy(),
    )


def box_points(lower: Sequence[float], upper: Sequence[float], shape: Sequence[int]) -> np.ndarray:
    """A regular grid ``[prod(shape), Dx]`` from ``lower`` to ``upper`` (both included), in C order."""
    if not (len(lower) == len(upper) == len(shape)) or min(shape) < 1:
        raise ConfigError(
            f"placement: a box needs a lower and upper bound and a size >= 1 per input; got lower {list(lower)}, "
            f"upper {list(upper)}, shape {list(shape)}."
        )
    bounds = zip(lower, upper, shape, strict=True)
    axes = [np.linspace(lo, hi, n) if n > 1 else np.array([(lo + hi) / 2]) for lo, hi, n in bounds]
    return np.stack([a.reshape(-1) for a in np.meshgrid(*axes, indexing="ij")], -1)


def _column(table: pd.DataFrame, name: str) -> str | None:
    """The column of ``table`` holding input ``name`` (``latitude`` may be ``lat``, any case), or None."""
    lowered = {str(c).strip().lower(): c for c in table.columns}
    return next((lowered[a] for a in ALIASES.get(name, (name,)) if a in lowered), None)


def read_candidates(path: str | Path, coords: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Candidate sites ``[C, Dx]`` from a CSV file with one column per model input (``coords``, e.g. latitude and
    longitude, or x0 and x1), and their names (a ``name`` or ``station_id`` column, else the row number)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--candidates {path}: no such file; give a CSV file of sites or 'grid'.")
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ConfigError(f"--candidates {path}: not a readable CSV file ({str(err).strip()}).") from None
    columns = [_column(table, c) for c in coords]
    if any(c is None for c in columns):
        missing = [c for c, col in zip(coords, columns, strict=True) if col is None]
        raise ConfigError(
            f"--candidates {path}: no column {', '.join(missing)}; a candidates file needs one column per model "
            f"input ({', '.join(coords)}) and may have a name column; it has {', '.join(map(str, table.columns))}."
        )
    values = table[columns].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(values).all(1)
    if bad.any() or not len(values):
        where = f"row {int(np.argmax(bad)) + 2} has a missing or non-numeric value" if bad.any() else "it has no rows"
        raise ConfigError(f"--candidates {path}: {where}; every candidate needs {', '.join(coords)}.")
    name = _column(table, "name") or _column(table, "station_id")
    names = table[name].astype(str).tolist() if name is not None else [str(i) for i in range(len(table))]
    return values, names


def placement_table(
    placement: Placement, coords: Sequence[str], names: Sequence[str], scale: float | None = None, units: str = ""
) -> pd.DataFrame:
    """One row per chosen site in order: ``round``, ``name``, its inputs, ``gain`` and ``variance_after``
    (normalised units) and, with the target's ``scale`` (std in physical units), ``gain_physical`` and its
    ``units`` (the target's squared)."""
    table = pd.DataFrame({"round": np.arange(1, len(placement.index) + 1)})
    table["name"] = [names[i] for i in placement.index]
    for d, name in enumerate(coords):
        table[name] = placement.sites[:, d]
    table["gain"] = placement.gains
    table["variance_before"] = placement.variance[:-1]
    table["variance_after"] = placement.variance[1:]
    if scale is not None:
        table["gain_physical"] = placement.gains * scale**2
        table["units"] = squared_units(units, "^2")
    return table


def squared_units(units: str, power: str = "²") -> str:
    """``K`` -> ``K²``, ``m s-1`` -> ``(m s-1)²``; empty without units."""
    if not units:
        return ""
    return f"{units}{power}" if units.isalnum() else f"({units}){power}"
