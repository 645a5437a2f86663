"""The map of a station placement (``gridtnp place``): where a first new station would help, and the predictive
std over the region once the chosen sites are added, the sites numbered in the order chosen.

* ``placement_figure(placement, candidates, region, existing, geographic, scale, units)``: a ``Figure`` (two map
  panels for 2-D inputs, one panel of std curves for 1-D ones).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gridtnp.inference.placement import Placement, squared_units
from gridtnp.report.map_axes import compact_longitudes, geographic_axes, map_figure
from gridtnp.report.plots import draw_field


def _number_sites(ax: Any, sites: np.ndarray, geographic: bool) -> None:
    """The chosen sites ``[K, 2]`` as stars labelled 1..K."""
    h, v = (sites[:, 1], sites[:, 0]) if geographic else (sites[:, 0], sites[:, 1])
    ax.scatter(h, v, marker="*", s=140, c="red", edgecolors="white", linewidths=0.6, zorder=6, label="chosen")
    for i, (a, b) in enumerate(zip(h, v, strict=True), start=1):
        ax.annotate(str(i), (a, b), xytext=(4, 4), textcoords="offset points", fontsize=9, weight="bold", zorder=7)


def _existing(ax: Any, existing: np.ndarray, geographic: bool) -> None:
    """The context stations ``[S, 2]`` of the first hour as small black dots."""
    if len(existing):
        h, v = (existing[:, 1], existing[:, 0]) if geographic else (existing[:, 0], existing[:, 1])
        ax.scatter(h, v, s=6, c="k", linewidths=0, zorder=5, label="context stations (first hour)")


def _curves(placement: Placement, region: np.ndarray, scale: float, units: str) -> Figure:
    """1-D inputs: the predictive std along the region before and after, the chosen sites as numbered lines."""
    fig = Figure(figsize=(7.2, 3.6), layout="constrained")
    ax = fig.add_subplot()
    order = np.argsort(region[:, 0])
    ax.plot(region[order, 0], placement.std_before[order] * scale, label="before", c="0.4")
    ax.plot(region[order, 0], placement.std_after[order] * scale, label="after", c="C3")
    for i, site in enumerate(placement.sites[:, 0], start=1):
        ax.axvline(site, c="C3", lw=0.6, ls=":")
        ax.annotate(str(i), (site, ax.get_ylim()[1]), ha="center", va="top", fontsize=9, weight="bold")
    ax.set_xlabel("x")
    ax.set_ylabel(f"predictive std [{units}]")
    ax.legend(fontsize=8)
    return fig


def placement_figure(
    placement: Placement,
    candidates: np.ndarray,
    region: np.ndarray,
    existing: np.ndarray,
    geographic: bool,
    scale: float = 1.0,
    units: str = "normalised",
) -> Figure:
    """Left: each candidate ``[C, Dx]`` coloured by its first-round gain (the drop of the region's mean predictive
    variance were it the only new station); right: the predictive std at the region's points ``[M, Dx]`` (mean
    over hours) after the chosen sites, both with the existing context stations ``[S, Dx]`` and the chosen sites
    numbered; values times ``scale`` (the target's std in ``units``)."""
    if region.shape[1] == 1:
        return _curves(placement, region, scale, units)
    if geographic:  # one longitude convention for every layer: a box across the date line stays one map
        candidates, region, existing, sites = compact_longitudes([candidates, region, existing, placement.sites])
    else:
        sites = placement.sites
    extent = [candidates, region]
    fig, nrows, ncols = map_figure(extent, 2, 2, 4.2, geographic)
    before = float(np.sqrt(np.mean(placement.std_before**2))) * scale
    after = float(np.sqrt(np.mean(placement.std_after**2))) * scale
    panels = [
        (
            candidates,
            placement.first_gains * scale**2,
            {"cmap": "viridis"},
            f"gain [{squared_units(units)}]" if units != "normalised" else "gain [normalised variance]",
            "gain of one new station at each candidate",
        ),
        (
            region,
            placement.std_after * scale,
            {"cmap": "magma"},
            f"predictive std [{units}]",
            f"std after {len(sites)} new sites (RMS {before:.3g} -> {after:.3g})",
        ),
    ]
    for i, (x, values, style, label, title) in enumerate(panels, start=1):
        ax = fig.add_subplot(nrows, ncols, i)
        fig.colorbar(draw_field(ax, x, values, geographic, **style), ax=ax, shrink=0.85, label=label)
        _existing(ax, existing, geographic)
        _number_sites(ax, sites, geographic)
        if geographic:
            geographic_axes(ax, extent)
        ax.set_title(title, fontsize=9)
    fig.axes[0].legend(fontsize=7, loc="lower left")
    return fig
