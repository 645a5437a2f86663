"""Where models fail: held-out errors and calibration split by hour of day, by distance to the nearest context
station and by coast / inland, over the ``Scored`` models of ``gridtnp.report.scorecard``.

* ``Breakdown``: one split of the held-out targets into groups, a metric per model and group.
* ``breakdowns(entries)``: RMSE by hour of day, by distance to the nearest context station and coast / inland
  (the coarse cell beside), and 90 % coverage and mean z^2 by distance.
* ``breakdown_html(items)``: their tables.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from gridtnp.report.html_parts import html_table
from gridtnp.report.scorecard import BASELINE, Z90, Scored
from gridtnp.report.station_geometry import COASTAL_KM, coast_distance_km, nearest_context_km

#: Bin edges (km) of the distance to the nearest context station.
DISTANCE_EDGES_KM = (0.0, 25.0, 50.0, 100.0, 200.0, np.inf)


@dataclass
class Breakdown:
    """Held-out targets split into ``groups`` (labels); ``values[model][g]`` the metric of group ``g``,
    ``counts[g]`` its targets; ``metric`` names what ``values`` hold (with units)."""

    key: str
    title: str
    metric: str
    groups: list[str]
    counts: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""


def _rmse(sq: np.ndarray, keep: np.ndarray) -> float:
    return float(np.sqrt(sq[keep].mean())) if keep.any() else float("nan")


def _split(key: str, title: str, entries: list[Scored], labels: list[str], group: np.ndarray, units: str) -> Breakdown:
    """RMSE of each model and the coarse cell over held-out targets in each group (``group [T, S]``: the index of
    each target's group in ``labels``, -1 for none)."""
    held = entries[0].held_out
    masks = [held & (group == g) for g in range(len(labels))]
    item = Breakdown(key, title, f"held-out RMSE [{units}]" if units else "held-out RMSE", labels, [])
    item.counts = [int(m.sum()) for m in masks]
    for e in entries:
        item.values[e.name] = [_rmse(e.error**2, m) for m in masks]
    if "baseline_sq_error" in entries[0].physical:
        base = entries[0].array("baseline_sq_error")
        item.values[BASELINE] = [_rmse(base, m) for m in masks]
    return item


def distance_groups(entries: list[Scored]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Labels of ``DISTANCE_EDGES_KM``'s bins, each target's bin ``[T, S]`` and its distance (km) to the nearest
    other context station of its hour ``[T, S]``."""
    ds = entries[0].physical
    points = np.stack([ds["latitude"].values, ds["longitude"].values], -1).astype(np.float64)
    distance = nearest_context_km(points, np.asarray(ds["is_context"].values).astype(bool))
    edges = np.asarray(DISTANCE_EDGES_KM)
    labels = [f"{a:.0f}-{b:.0f} km" if np.isfinite(b) else f"over {a:.0f} km" for a, b in itertools.pairwise(edges)]
    group = np.where(np.isfinite(distance), np.digitize(distance, edges[1:-1]), -1)
    return labels, group, distance


def breakdowns(entries: list[Scored], units: str) -> list[Breakdown]:
    """By hour of day (UTC), by distance to the nearest context station, coast / inland (within ``COASTAL_KM`` of
    the GSHHS coastline), and the calibration (90 % coverage, mean z^2) by distance."""
    ds = entries[0].physical
    shape = entries[0].held_out.shape
    hours = np.asarray(ds.indexes["time"].hour)
    present = sorted(set(hours.tolist()))
    by_hour = np.broadcast_to(np.searchsorted(present, hours)[:, None], shape)
    items = [_split("hour", "by hour of day (UTC)", entries, [f"{h:02d} UTC" for h in present], by_hour, units)]
    labels, by_distance, _ = distance_groups(entries)
    near = _split("distance", "by distance to the nearest context station", entries, labels, by_distance, units)
    near.note = "The distance from the target station to the nearest other station in that hour's context."
    items.append(near)
    points = np.stack([ds["latitude"].values, ds["longitude"].values], -1).astype(np.float64)
    coast = coast_distance_km(points)
    if np.isfinite(coast).any():
        kind = np.where(np.isfinite(coast), (coast > COASTAL_KM).astype(int), -1)
        split = _split(
            "coast", "coast / inland", entries, ["coastal", "inland"], np.broadcast_to(kind[None], shape), units
        )
        split.note = (
            f"Coastal: within {COASTAL_KM:.0f} km of the GSHHS intermediate coastline (nearest vertex; "
            f"{int((kind == 0).sum())} stations), inland: farther ({int((kind == 1).sum())} stations)."
        )
        items.append(split)
    held = entries[0].held_out
    masks = [held & (by_distance == g) for g in range(len(labels))]
    for key, metric, of in (
        ("coverage", "90 % coverage", lambda z: (np.abs(z) <= Z90).astype(float)),
        ("z2", "mean z^2", lambda z: z**2),
    ):
        item = Breakdown(key, f"{metric} by distance to the nearest context station", metric, labels, [])
        item.counts = [int(m.sum()) for m in masks]
        for e in entries:
            values = of(e.z)
            item.values[e.name] = [float(values[m].mean()) if m.any() else float("nan") for m in masks]
        items.append(item)
    return items


def breakdown_html(items: list[Breakdown]) -> str:
    """One table per breakdown: a row per model, a column per group with its number of held-out targets."""
    blocks = []
    for item in items:
        head = [item.metric, *(f"{g} ({n:,})" for g, n in zip(item.groups, item.counts, strict=True))]
        digits = 2 if item.key in ("coverage", "z2") else 3
        rows = [[name, *("-" if v != v else f"{v:.{digits}f}" for v in values)] for name, values in item.values.items()]
        classes = ["baseline" if name == BASELINE else "" for name in item.values]
        note = f"<p>{item.note}</p>" if item.note else ""
        blocks.append(f'<h3 id="breakdown-{item.key}">{item.title}</h3>{html_table(head, rows, classes)}{note}')
    return "".join(blocks)
