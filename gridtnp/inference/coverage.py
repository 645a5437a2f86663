"""How much of the model's domain a user's gridded context leaves without a value, and the warning that says so.

A grid trimmed at its edges (``coarsen(..., boundary="trim")``), or with missing (NaN) cells, costs accuracy: more
for a model trained with the whole box covered (partial blocks at every edge, at every offset) than for one trained
with ``task.coverage_dropout``. ``predict`` warns in one line when more than ``UNCOVERED_SHARE`` of the model's
domain, or of the targets' surroundings, is uncovered.

* ``uncovered_shares(axes, finite, region, targets, bounds)``: the largest share over tasks of the ``region``, and of
  the part of it within one cell of a target, that no cell with a value covers.
* ``warn_uncovered(model, context, coords, batch_dim, bounds, targets, centre)``: the warning, per gridded source
  of ``predict``'s xarray context.
* ``warn_uncovered_batch(model, context, target)``: the same for the first task of a batch of tensors (``gridtnp
  predict``): a source whose points lie on a lattice (its distinct coordinates along each input) is read as a grid.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from gridtnp.batch import Observations
from gridtnp.data.layout import wrap_longitude
from gridtnp.inference.cells import LONGITUDES, Bounds, cell_edges, is_gridded

#: ``predict`` warns when a gridded context leaves more than this share of the model's domain, or of the targets'
#: surroundings, without a value.
UNCOVERED_SHARE = 0.01
#: A batch's source is read as a grid when its points fill at least this share of the lattice of their coordinates.
LATTICE_FILLED = 0.75
#: Sample points of the domain, all dimensions together, at which coverage is read.
SAMPLES = 2**14


def uncovered_shares(
    axes: Sequence[np.ndarray],
    finite: np.ndarray,
    region: tuple[np.ndarray, np.ndarray],
    targets: np.ndarray,
    bounds: Sequence[np.ndarray | None] | None = None,
) -> tuple[float, float]:
    """The largest share over tasks of ``region = (lower [d], upper [d])``, and of its part within one cell of a
    target (``targets [N, d]``), that no cell with a value covers; cells are centred at ``axes`` (``d`` arrays
    ``[n_k]``), ``finite [B, n_1, ..., n_d]`` says which hold a value, ``bounds`` their CF bounds (``[n_k, 2]``)."""
    d = len(axes)
    m = max(8, round(SAMPLES ** (1 / d)))
    lower, upper = (np.asarray(r, dtype=np.float64) for r in region)
    step = (upper - lower) / m
    index, has, width = [], [], []
    for k, centres in enumerate(axes):
        low, high = cell_edges(centres, None if bounds is None else bounds[k])
        samples = lower[k] + (np.arange(m) + 0.5) * step[k]
        inside = (samples[None] >= low[:, None]) & (samples[None] < high[:, None])  # [n_k, m]
        index.append(inside.argmax(0))
        has.append(inside.any(0))
        width.append(float(np.median(high - low)) if len(centres) else 0.0)
    covered = finite[(slice(None), *np.ix_(*index))]  # [B, m, ..., m]
    for k in range(d):
        covered = covered & has[k].reshape([1] * (k + 1) + [m] + [1] * (d - k - 1))
    domain = float(1.0 - covered.reshape(len(covered), -1).mean(1).max()) if len(covered) else 0.0
    near = np.zeros((m,) * d, dtype=bool)  # sample points within one cell of a target
    cell = np.floor((targets - lower) / np.where(step > 0, step, 1.0)).astype(np.int64)  # [N, d]
    ok = np.all((cell >= 0) & (cell < m), axis=1)
    near[tuple(cell[ok].T)] = True
    for k in range(d):
        reach = math.ceil(width[k] / step[k]) if step[k] > 0 else 0
        grown = near.copy()
        for shift in range(1, min(reach, m) + 1):
            ahead = [slice(None)] * d
            behind = [slice(None)] * d
            ahead[k], behind[k] = slice(shift, None), slice(None, -shift)
            grown[tuple(ahead)] |= near[tuple(behind)]
            grown[tuple(behind)] |= near[tuple(ahead)]
        near = grown
    if not near.any():
        return domain, 0.0
    gaps = (~covered & near).reshape(len(covered), -1).sum(1) / near.sum()
    return domain, float(gaps.max())


def warn_uncovered(
    model: torch.nn.Module | Any,
    context: Mapping[str, xr.DataArray],
    coords: Sequence[str],
    batch_dim: str | None,
    bounds: Bounds,
    targets: np.ndarray,
    centre: float = 0.0,
) -> None:
    """Warn, one line per gridded source, when it leaves more than ``UNCOVERED_SHARE`` of the model's domain (its
    grid's box; without a grid, the source's own extent) or of the targets' (``[N, Dx]``) surroundings uncovered;
    and ``warn_beyond_training_box`` (``model``: a ``NeuralProcessModule`` or its ``NeuralProcess``)."""
    warn_beyond_training_box(model, targets)
    model = getattr(model, "model", model)
    for name, array in context.items():
        if not is_gridded(array, coords) or any(array.sizes[c] < 2 for c in coords):
            continue
        axes = []
        for c in coords:
            values = array[c].values.astype(np.float64)
            if c in LONGITUDES:
                values = np.unwrap(wrap_longitude(values, centre), period=360.0)
            axes.append(values)
        given = bounds.get(name, {})
        edges = [given.get(c) for c in coords]
        values = array.transpose(*([batch_dim] if batch_dim else []), *coords).values
        finite = np.isfinite(values.reshape(-1, *values.shape[-len(coords) :]))
        region, where = _region(model, name, axes, edges)
        _warn(name, where, *uncovered_shares(axes, finite, region, targets, edges))


def warn_uncovered_batch(model: Any, context: Mapping[str, Observations], target: Observations) -> None:
    """``warn_uncovered`` for the first task of a batch: each source whose valid points ``x [N, Dx]`` fill at least
    ``LATTICE_FILLED`` of the lattice of their distinct coordinates is a grid (stations, or a multi-source task's
    random share of the points, fill a small share of theirs)."""
    targets = target.x[0][target.mask[0]].detach().double().cpu().numpy()
    warn_beyond_training_box(model, targets)
    model = getattr(model, "model", model)
    for name, obs in context.items():
        x = obs.x[0][obs.valid()[0]].detach().double().cpu().numpy()  # [N, Dx]
        if len(x) < 4:
            continue
        axes, where_on = zip(*(np.unique(x[:, k], return_inverse=True) for k in range(x.shape[1])), strict=True)
        sizes = [len(a) for a in axes]
        if min(sizes) < 2 or np.prod(sizes, dtype=np.float64) > len(x) / LATTICE_FILLED:
            continue
        finite = np.zeros((1, *sizes), dtype=bool)
        finite[(0, *where_on)] = True
        region, where = _region(model, name, axes, [None] * len(axes))
        _warn(name, where, *uncovered_shares(list(axes), finite, region, targets), stacklevel=3)


def _region(
    model: torch.nn.Module, name: str, axes: Sequence[np.ndarray], edges: Sequence[np.ndarray | None]
) -> tuple[tuple[np.ndarray, np.ndarray], str]:
    """The box coverage is read over: the model's grid, or without one (of that dimension) the source's cells."""
    grid = getattr(model, "grid", None)
    if grid is not None and len(grid.lower) == len(axes):
        box = (np.asarray(grid.lower, dtype=np.float64), np.asarray(grid.upper, dtype=np.float64))
        return box, "the model's domain"
    cells = [cell_edges(a, e) for a, e in zip(axes, edges, strict=True)]
    return (np.array([c[0].min() for c in cells]), np.array([c[1].max() for c in cells])), f"the extent of {name!r}"


def _warn(name: str, where: str, domain: float, around: float, stacklevel: int = 4) -> None:
    """The one-line warning, when either share exceeds ``UNCOVERED_SHARE`` (``stacklevel`` 4: the caller of
    ``predict``, through ``torch.no_grad``)."""
    if max(domain, around) > UNCOVERED_SHARE:
        warnings.warn(
            f"predict: the gridded context {name!r} leaves {domain:.1%} of {where} and {around:.1%} of the "
            "targets' surroundings (within one cell of a target) without a value (a grid trimmed at its edges, or "
            "missing cells); predictions lose accuracy there and near it, more for a model trained without "
            "coverage_dropout: keep the partial cells at the grid's edges and fill what you can (docs/predict.md, "
            "'The grid the model expects').",
            stacklevel=stacklevel,
        )


def warn_beyond_training_box(module: Any, targets: np.ndarray) -> None:
    """Warn when targets ``[N, Dx]`` lie beyond the box of the data a grid-free model was trained on (the checkpoint's
    ``data_metadata["box"]``, ``GridDataModule.target_box``) by more than a tenth of its size (at least 0.5): nothing
    else says so for a model without a grid (a gridded one warns by its grid, ``warn_outside_grid``)."""
    box = (getattr(module, "data_metadata", None) or {}).get("box")
    model = getattr(module, "model", module)
    if not box or getattr(model, "grid", None) is not None or len(targets) == 0:
        return
    lower, upper = (np.asarray(v, dtype=np.float64) for v in box["grid"])
    if targets.shape[-1] != len(lower):
        return
    with np.errstate(invalid="ignore"):
        beyond = np.nanmax(np.maximum(lower - targets, targets - upper), axis=0)  # [Dx]
    over = beyond - np.maximum(0.1 * (upper - lower), 0.5)
    if not np.nanmax(over) > 0:
        return
    d, names = int(np.nanargmax(over)), list(box.get("axes") or [f"input {k}" for k in range(len(lower))])
    span = ", ".join(f"{n} {a:g} to {b:g}" for n, a, b in zip(names, lower, upper, strict=True))
    warnings.warn(
        f"targets lie outside the box of the training data ({span}) by up to {beyond[d]:.4g} along {names[d]}: "
        "this model has no grid and extrapolates there.",
        stacklevel=3,
    )
