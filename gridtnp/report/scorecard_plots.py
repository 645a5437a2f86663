"""Figures of ``gridtnp report --compare``: who wins at each station, the breakdowns, and the observation-impact map.

* ``plot_winners(points, rmse, names)``: a map of the model with the lowest held-out RMSE at each station.
* ``plot_breakdowns(items)``: RMSE by hour, by distance to the nearest context station, coast / inland, and the
  90 % coverage and mean z^2 by distance, one line (or bar) per model, the ideal values dashed.
* ``plot_impact(points, impact, scale, units)``: per station, the drop of the other held-out stations' RMSE and mean
  predictive std when it is added to the context.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from gridtnp.report.breakdowns import Breakdown
from gridtnp.report.impact import Impact
from gridtnp.report.map_axes import compact_longitudes, geographic_axes, map_figure
from gridtnp.report.plots import draw_field
from gridtnp.report.scorecard import BASELINE


def _colour(name: str, names: list[str]) -> str:
    return "0.45" if name == BASELINE else f"C{names.index(name) % 10}"


def plot_winners(points: np.ndarray, rmse: np.ndarray, names: list[str]) -> Figure:
    """Stations ``points [S, 2]`` (lat, lon) coloured by the row of ``rmse [M, S]`` (named ``names``) that is
    lowest there; stations never held out are grey rings."""
    from gridtnp.report.scorecard import winners

    x = compact_longitudes([points])[0]
    best = winners(rmse)
    fig, _, _ = map_figure([x], 1, 1, 5.2)
    ax = fig.add_subplot()
    for i, name in enumerate(names):
        here = best == i
        ax.scatter(x[here, 1], x[here, 0], s=28, c=_colour(name, names), label=f"{name} ({int(here.sum())})", zorder=4)
    none = best < 0
    if none.any():
        ax.scatter(x[none, 1], x[none, 0], s=22, facecolors="none", edgecolors="0.6", label="never held out", zorder=4)
    geographic_axes(ax, [x])
    ax.legend(fontsize=8, loc="upper left", title="lowest held-out RMSE", title_fontsize=8)
    ax.set_title("who wins at each station (held-out RMSE over the split)", fontsize=10)
    return fig


def plot_breakdowns(items: list[Breakdown]) -> Figure:
    """One panel per breakdown: the metric of each model (lines; bars for two groups) against the groups."""
    fig = Figure(figsize=(4.6 * min(len(items), 3), 3.6 * -(-len(items) // 3)), layout="constrained")
    names = list(dict.fromkeys(n for item in items for n in item.values))
    for i, item in enumerate(items, start=1):
        ax = fig.add_subplot(-(-len(items) // 3), min(len(items), 3), i)
        where = np.arange(len(item.groups))
        if len(item.groups) <= 2:
            width = 0.8 / max(len(item.values), 1)
            for j, (name, values) in enumerate(item.values.items()):
                ax.bar(where + j * width, values, width, color=_colour(name, names), label=name)
            ax.set_xticks(where + width * (len(item.values) - 1) / 2, item.groups)
        else:
            for name, values in item.values.items():
                ax.plot(where, values, "o-", ms=4, color=_colour(name, names), label=name)
            ax.set_xticks(where, item.groups, rotation=30 if len(item.groups) > 4 else 0, fontsize=8)
        ideal = {"coverage": 0.9, "z2": 1.0}.get(item.key)
        if ideal is not None:
            ax.axhline(ideal, color="k", ls="--", lw=1, label=f"ideal ({ideal:g})")
        ax.set_ylabel(item.metric, fontsize=8)
        ax.set_title(item.title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("held-out targets by hour, distance to the nearest context station and coast / inland")
    return fig


def plot_impact(points: np.ndarray, impact: Impact, scale: float, units: str) -> Figure:
    """Two maps of the stations ``points [S, 2]``: the drop of the other held-out stations' RMSE and of their mean
    predictive std when each is added to the context (``impact`` in normalised units, times ``scale``)."""
    x = compact_longitudes([points])[0]
    u = f" [{units}]" if units else ""
    rmse, std = impact.rmse_drop * scale, impact.std_drop * scale
    d = float(np.nanpercentile(np.abs(rmse), 98)) if np.isfinite(rmse).any() else 1.0
    panels = [
        ("drop of the other stations' held-out RMSE", rmse, {"cmap": "PuOr", "vmin": -d, "vmax": d}, f"RMSE drop{u}"),
        ("drop of their mean predictive std", std, {"cmap": "viridis"}, f"std drop{u}"),
    ]
    fig, nrows, ncols = map_figure([x], 2, 2, 4.6)
    for i, (title, values, style, label) in enumerate(panels, start=1):
        ax = fig.add_subplot(nrows, ncols, i)
        ok = np.isfinite(values)
        artist = draw_field(ax, x[ok], values[ok], True, **style)
        ax.scatter(x[~ok, 1], x[~ok, 0], s=10, facecolors="none", edgecolors="0.6", zorder=3)
        fig.colorbar(artist, ax=ax, shrink=0.85, label=label)
        geographic_axes(ax, [x])
        ax.set_title(f"{title} ({int(ok.sum())} stations)", fontsize=9)
    hours = f"{len(impact.times)} hour{'s' * (len(impact.times) != 1)}"
    fig.suptitle(f"observation impact over {hours} (positive: the other stations improve)")
    return fig
