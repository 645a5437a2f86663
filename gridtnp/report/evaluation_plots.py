"""Figures of one evaluation of a checkpoint (``gridtnp plot``, ``gridtnp report``), in physical units.

* ``split_figures(evaluation, module, datamodule)``: every figure of an ``Evaluation`` by name: maps of the first
  tasks in physical units where the DataModule converts its outputs (``predictions_to_xarray``), colour bars naming
  the variable and its units; calibration by kind; for station tasks the per-station RMSE map and time series.
* ``map_in_units``, ``plot_station_errors``, ``pick_stations``, ``plot_station_series``: those figures one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure

from gridtnp.batch import Batch
from gridtnp.metrics import central_interval_halfwidth
from gridtnp.report.calibration_plots import plot_calibration, plot_standardised_errors
from gridtnp.report.evaluation import context_in_units, errors_by_kind, variable_label
from gridtnp.report.map_axes import compact_longitudes, degrees_east, degrees_north, geographic_axes, map_figure
from gridtnp.report.plots import (
    MAX_MARKED_POINTS,
    MapData,
    draw_field,
    draw_map,
    is_geographic,
    oracle_posterior,
    plot_gp1d,
    plot_map,
    regular_grid,
    to_numpy,
)


def map_in_units(one: Batch, physical: Any, module: Any, title: str = "") -> Figure:
    """One task (``one``, a batch of one) in physical units: its targets from ``physical`` (that task's row of
    ``Evaluation.physical``, a station Dataset with ``observed``, ``mean``, ``std``, ``is_context``) and its
    context sources converted with the checkpoint's statistics and climatology (``context_in_units``; a source
    it has none for stays normalised)."""

    observed = np.asarray(physical["observed"].values, dtype=np.float64)
    keep = np.isfinite(observed)
    x = np.stack([physical["latitude"].values, physical["longitude"].values], -1)[keep]
    label = variable_label(physical["mean"].attrs)
    units = str(physical["mean"].attrs.get("units", "")) or "normalised"
    context, marked = [], []
    for name, obs in one.context.items():
        ok = to_numpy(obs.mask[0]).astype(bool)
        xs, values = to_numpy(obs.x[0])[ok], to_numpy(obs.y[0, :, 0])[ok]
        converted = context_in_units(module, name, xs, values, physical["time"].values)
        if converted is None:
            context.append((name, xs, values, "(normalised units)"))
        else:
            context.append((name, xs, converted[0], variable_label(converted[1], name)))
        if 0 < len(xs) <= MAX_MARKED_POINTS and regular_grid(xs) is None:
            marked.append(xs)
    data = MapData(
        x,
        observed[keep],
        np.asarray(physical["mean"].values, dtype=np.float64)[keep],
        np.asarray(physical["std"].values, dtype=np.float64)[keep],
        label,
        units,
        context,
        marked,
        truth="truth: ERA5 at the stations",
    )
    return draw_map(data, True, title)


def plot_station_errors(physical: Any, title: str = "") -> Figure:
    """Per-station RMSE over every hour a station was a target, from a station Dataset (``Evaluation.physical``:
    ``mean``, ``observed``, and ``baseline_sq_error`` when the batches carry the coarse-cell baseline): the model's,
    the baseline's, and the model minus the baseline (blue: the model is better there)."""

    units = str(physical["mean"].attrs.get("units", ""))
    err = (physical["mean"] - physical["observed"]) ** 2
    rmse = np.sqrt(err.mean("time", skipna=True).values)
    x = compact_longitudes([np.stack([physical["latitude"].values, physical["longitude"].values], -1)])[0]
    panels = [("model RMSE", rmse, {"cmap": "magma_r", "vmin": 0.0})]
    if "baseline_sq_error" in physical:
        baseline = np.sqrt(physical["baseline_sq_error"].mean("time", skipna=True).values)
        panels.append(("coarse-cell baseline RMSE", baseline, {"cmap": "magma_r", "vmin": 0.0}))
        diff = rmse - baseline
        d = float(np.nanpercentile(np.abs(diff), 98)) if np.isfinite(diff).any() else 1.0
        panels.append(("model RMSE - baseline RMSE", diff, {"cmap": "RdBu_r", "vmin": -d, "vmax": d}))
        high = float(np.nanpercentile(np.concatenate([rmse, baseline]), 99))
        for _, _, style in panels[:2]:
            style["vmax"] = high
    fig, nrows, ncols = map_figure([x], len(panels), len(panels), 4.2)
    for i, (name, values, style) in enumerate(panels, start=1):
        ax = fig.add_subplot(nrows, ncols, i)
        ok = np.isfinite(values)
        artist = draw_field(ax, x[ok], values[ok], True, **style)
        fig.colorbar(artist, ax=ax, shrink=0.85, label=f"RMSE [{units}]" if i < 3 else f"difference [{units}]")
        geographic_axes(ax, [x[ok]])
        ax.set_title(f"{name} ({int(ok.sum())} stations)", fontsize=9)
    hours = physical.sizes["time"]
    span = f"{hours} hours" if hours != 1 else "1 hour"
    fig.suptitle(title or f"per-station RMSE of {variable_label(physical['mean'].attrs)} over {span}")
    return fig


def pick_stations(physical: Any, count: int = 3) -> list[int]:
    """Stations for time series: the one with the largest held-out RMSE, one in the middle and the smallest,
    among the stations held out in most hours (a station mostly in the context is predicted almost exactly there,
    which says nothing of the model; all stations where none is held out that often)."""
    held = physical["mean"].notnull() & physical["observed"].notnull()
    if "is_context" in physical:
        in_context = physical["is_context"].astype(bool) & held
        held = held & ~physical["is_context"].astype(bool)
        mostly_out = (held.sum("time") > in_context.sum("time")).values
    else:
        mostly_out = np.ones(physical.sizes["station"], dtype=bool)
    sq = ((physical["mean"] - physical["observed"]) ** 2).where(held)
    rmse = np.sqrt(sq.mean("time", skipna=True).values)
    if mostly_out.any():
        rmse = np.where(mostly_out, rmse, np.nan)
    order = [int(i) for i in np.argsort(np.where(np.isfinite(rmse), -rmse, np.inf)) if np.isfinite(rmse[i])]
    if len(order) <= count:
        return order
    picks = [order[round(k * (len(order) - 1) / (count - 1))] for k in range(count)] if count > 1 else order[:1]
    return list(dict.fromkeys(picks))


def plot_station_series(physical: Any, stations: list[int] | None = None) -> Figure:
    """Time series at a few stations (``pick_stations`` by default) over the split: the truth (ERA5 at the
    station), the predictive mean with its central 90 % interval, hours when the station was in the context
    marked."""

    stations = pick_stations(physical) if stations is None else stations
    first = ~physical.indexes["time"].duplicated()  # one task per hour (the first context draw)
    data = physical.isel(time=np.flatnonzero(first))
    label = variable_label(data["mean"].attrs)
    units = str(data["mean"].attrs.get("units", ""))
    h = central_interval_halfwidth(0.9)
    fig = Figure(figsize=(11, 2.6 * max(len(stations), 1)), layout="constrained")
    axes = fig.subplots(max(len(stations), 1), 1, squeeze=False)[:, 0]
    for ax, s in zip(axes, stations, strict=False):
        row = data.isel(station=s)
        time = row["time"].values
        mean, std, obs = (np.asarray(row[k].values, dtype=np.float64) for k in ("mean", "std", "observed"))
        if len(time) > 2:
            ax.fill_between(time, mean - h * std, mean + h * std, color="C0", alpha=0.25, lw=0, label="90 % interval")
            ax.plot(time, mean, color="C0", lw=1.2, label="predictive mean")
        else:  # a band and a line need more hours: each hour's mean as a tick on its interval
            ax.errorbar(time, mean, yerr=h * std, fmt="_", color="C0", ms=14, capsize=4, label="mean, 90 % interval")
            hour = np.timedelta64(1, "h")
            ax.set_xlim(time.min() - hour, time.max() + hour)
        ax.plot(time, obs, "k.", ms=3, label="ERA5 at the station")
        if "is_context" in row:
            ctx = np.asarray(row["is_context"].values).astype(bool)
            ax.plot(time[ctx], obs[ctx], "o", mfc="none", mec="C3", ms=5, label="in the context")
        out = ~np.asarray(row["is_context"].values).astype(bool) if "is_context" in row else np.isfinite(obs)
        rmse = float(np.sqrt(np.nanmean(((mean - obs) ** 2)[out]))) if out.any() else float("nan")
        name = str(row["station_id"].values) if "station_id" in row.coords else f"station {s}"
        lat, lon = float(row["latitude"]), float(row["longitude"])
        where = f"{degrees_north(round(lat, 2))}, {degrees_east(round(lon, 2))}"
        ax.set_title(f"{name} ({where}): held-out RMSE {rmse:.2f} {units}".rstrip(), fontsize=9)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7, ncols=4, loc="upper left")
    fig.suptitle(
        "ERA5 at the station and the prediction at three stations held out in most hours (largest, middle and "
        "smallest held-out RMSE)"
    )
    return fig


@rc_context({"text.parse_math": False})  # units and names from the data drawn as written, a "$" too
def split_figures(evaluation: Any, module: Any, datamodule: Any, geographic: bool | None = None) -> dict[str, Figure]:
    """The figures of one evaluation (``gridtnp.report.evaluation.Evaluation``) by name: ``task<i>`` for each kept task
    (1-D plot, or a map, in physical units where ``evaluation.physical`` has them), ``standardised_errors`` and
    ``reliability`` (``plot_calibration`` by kind of target) over the split, and for station tasks
    ``station_rmse`` and ``station_series``. ``geographic`` None asks the DataModule."""

    geographic = is_geographic(datamodule) if geographic is None else geographic
    posterior = oracle_posterior(datamodule)
    physical = evaluation.physical
    stations = physical is not None and "station" in physical.dims and "observed" in physical
    split, seen = evaluation.split, evaluation.num_tasks
    figures: dict[str, Figure] = {}
    for i, (one, out) in enumerate(evaluation.tasks):
        dim_x = one.target.x.shape[-1]
        name = f"task{i:03d}"
        if dim_x == 1:
            figures[name] = plot_gp1d(getattr(module, "model", module), one, 0, posterior)
        elif dim_x == 2 and stations and geographic:
            row = physical.isel(time=i)
            when = np.datetime_as_string(row["time"].values, unit="m").replace("T", " ")
            figures[name] = map_in_units(one, row, module, f"{split} task {i}: {when} UTC")
        elif dim_x == 2:
            figures[name] = plot_map(one, out["mean"], out["std"], 0, geographic, f"{split} task {i}")
    groups = errors_by_kind(evaluation.outputs, evaluation.calibrated)
    pooled = groups["all"]["after rescaling" if evaluation.calibrated else "model"]
    figures["standardised_errors"] = plot_standardised_errors(
        pooled, title=f"{split}: standardised errors of {seen} tasks"
    )
    figures["reliability"] = plot_calibration(groups, title=f"{split}: calibration over {seen} tasks by kind of target")
    if stations and geographic:
        figures["station_rmse"] = plot_station_errors(physical)
        figures["station_series"] = plot_station_series(physical)
    return figures
