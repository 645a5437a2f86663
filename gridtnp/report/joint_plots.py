"""The report's section on a joint predictive: sample maps of one hour and the distribution of the regional mean.

* ``plot_sample_maps(samples, hour, count, geographic)``: the predictive mean, ``count`` joint samples and one
  independent sample of one hour on one colour scale, and below each its departure from the mean.
* ``plot_regional_means(samples)``: per hour, the histogram of the sampled regional means beside the regional mean's
  predictive from the covariance and its 90 % interval, the same from the marginals alone (the stations taken as
  independent), and the observed regional mean.
* ``joint_section(module, datamodule, split, metrics, num_tasks, hours)``: the page's HTML, figures embedded; one line
  saying why where the predictive is independent per target.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure

from gridtnp.metrics import central_interval_halfwidth
from gridtnp.report.html_parts import figure_html
from gridtnp.report.joint_samples import SAMPLES, SEED, JointSamples, draw_joint_samples
from gridtnp.report.map_axes import compact_longitudes, geographic_axes
from gridtnp.report.plots import draw_field

#: Central interval of the regional mean (the ``regional_mean_coverage_90`` metric's).
LEVEL = 0.9


def plot_sample_maps(samples: JointSamples, hour: int = 0, count: int = 3, geographic: bool = True) -> Figure:
    """Hour ``hour`` of ``samples``: top row, the predictive mean, ``count`` joint samples and one independent sample
    (from the marginals alone) at the targets on one colour scale; bottom row, each minus the mean (under the mean,
    the truth minus the mean: what a calibrated predictive's samples should resemble) on one symmetric scale."""
    keep = samples.weight[hour] > 0
    x = samples.x[hour][keep]
    if geographic:
        x = compact_longitudes([x])[0]
    mean = samples.mean[hour][keep]
    fields = [("predictive mean", mean)]
    fields += [(f"joint sample {i + 1}", samples.joint[i, hour][keep]) for i in range(count)]
    fields.append(("independent sample (marginals)", samples.independent[0, hour][keep]))
    departures = [("truth - mean", samples.observed[hour][keep] - mean)]
    departures += [(f"{name} - mean", values - mean) for name, values in fields[1:]]
    shown = np.concatenate([v for _, v in fields])
    low, high = np.percentile(shown[np.isfinite(shown)], [1, 99])
    spread = np.abs(np.concatenate([v for _, v in departures]))
    limit = float(np.percentile(spread[np.isfinite(spread)], 99)) or 1.0
    ncols = len(fields)
    fig = Figure(figsize=(3.5 * ncols, 6.6), layout="constrained")
    axes = fig.subplots(2, ncols, squeeze=False)
    rows = [
        (fields, {"cmap": "viridis", "vmin": low, "vmax": high}, samples.label),
        (departures, {"cmap": "RdBu_r", "vmin": -limit, "vmax": limit}, f"departure from the mean [{samples.units}]"),
    ]
    for r, (panels, style, label) in enumerate(rows):
        artist = None
        for c, (name, values) in enumerate(panels):
            ax = axes[r, c]
            artist = draw_field(ax, x, values, geographic, **style)
            if geographic:
                geographic_axes(ax, [x])
            if c:
                ax.set_ylabel("")
            if r == 0:
                ax.set_xlabel("")
            ax.set_title(name, fontsize=9)
        fig.colorbar(artist, ax=axes[r, :].tolist(), shrink=0.85, label=label)
    fig.suptitle(
        f"{samples.times[hour]}: samples of the predictive at {int(keep.sum()):,} targets (top) and their departures "
        "from its mean (bottom)"
    )
    return fig


def _gaussian(ax: Any, centre: float, std: float, count: int, width: float, **style: Any) -> None:
    """The density of N(centre, std^2) scaled to a histogram of ``count`` values in bins ``width`` wide."""
    grid = np.linspace(centre - 4 * std, centre + 4 * std, 200)
    density = np.exp(-0.5 * ((grid - centre) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    ax.plot(grid, density * count * width, **style)


def plot_regional_means(samples: JointSamples, per_row: int = 4) -> Figure:
    """Per hour of ``samples``: the histogram of the joint samples' regional means, the Gaussian of the regional mean
    from the covariance with its central 90 % interval (shaded), the same from the marginals alone (dashed grey:
    the stations' errors taken as independent) and the observed regional mean (black line)."""
    joint = samples.regional(samples.joint)  # [M, H]
    observed, centre = samples.regional(samples.observed), samples.regional(samples.mean)  # [H]
    std, std_independent = samples.regional_std(), samples.regional_std(independent=True)
    half = central_interval_halfwidth(LEVEL)
    hours = samples.hours
    ncols = min(per_row, hours)
    nrows = math.ceil(hours / ncols)
    fig = Figure(figsize=(3.9 * ncols, 3.1 * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for h in range(hours):
        ax = axes[h]
        low, high = centre[h] - half * std[h], centre[h] + half * std[h]
        ax.axvspan(low, high, color="C0", alpha=0.12, lw=0, label="90 % interval (covariance)")
        _, edges, _ = ax.hist(joint[:, h], bins=40, color="C0", alpha=0.6, label=f"{len(joint):,} joint samples")
        width = float(edges[1] - edges[0])
        _gaussian(ax, centre[h], std[h], len(joint), width, color="C0", lw=1.5, label="predictive (covariance)")
        _gaussian(ax, centre[h], std_independent[h], len(joint), width, color="0.4", lw=1, ls="--",
                  label="stations independent (marginals)")  # fmt: skip
        for i, edge in enumerate((centre[h] - half * std_independent[h], centre[h] + half * std_independent[h])):
            ax.axvline(edge, color="0.4", ls=":", lw=1, label="90 % interval, independent" if not i else None)
        ax.axvline(observed[h], color="k", lw=2, label="truth")
        inside = "inside" if low <= observed[h] <= high else "outside"
        ax.set_title(f"{samples.times[h]}: truth {inside} the 90 % interval", fontsize=9)
        ax.set_xlabel(f"regional mean of {samples.label}", fontsize=8)
        ax.set_ylabel("samples", fontsize=8)
    for ax in axes[hours:]:
        ax.set_visible(False)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=6, fontsize=8)
    fig.suptitle("Regional mean (weighted mean over the targets of an hour): joint samples and the predictive")
    return fig


def joint_section(
    module: Any, datamodule: Any, split: str, metrics: dict[str, float], num_tasks: int, hours: int
) -> str:
    """The section on the joint predictive of ``module`` over ``hours`` tasks spread over ``split`` (0: none): its
    coverage metric (over ``num_tasks`` tasks), sample maps of one hour and the regional means' histograms."""
    from gridtnp.report.compare import impact_batch
    from gridtnp.report.plots import is_geographic

    if hours <= 0:
        return ""
    batch = module.transfer_batch_to_device(impact_batch(datamodule, split, hours), module.device, 0)
    samples = draw_joint_samples(module, datamodule, batch)
    if samples is None:
        return (
            '<h2 id="joint-samples">Joint samples</h2><p id="joint-none">Not drawn: this model\'s predictive is '
            "independent per target (no joint covariance), so its samples would be noise around the mean and the "
            "interval of a regional mean too narrow; a joint likelihood (<code>lowrank_gaussian</code>, "
            "docs/joint.md) gives them.</p>"
        )
    coverage = metrics.get("regional_mean_coverage_90")
    if coverage is not None:
        covered = (
            f"Over the {num_tasks:,} tasks of the {html.escape(split)} split the observed regional mean lies in the "
            f"central 90 % interval of its predictive (from the covariance, as <code>regional_mean_coverage_90</code> "
            f"in the metric table) in <strong>{coverage:.3f}</strong> of them ({round(coverage * num_tasks):,}); "
            "0.9 when calibrated."
        )
    else:
        covered = "The coverage of the regional mean over the split is a test metric: run the report on the test split."
    parts = []
    hour = samples.hours // 2  # the sample maps' hour: the middle one
    with rc_context({"text.parse_math": False}):  # units and names from the data drawn as written
        if samples.x.shape[-1] == 2:
            geographic = is_geographic(datamodule)
            parts.append(
                figure_html(
                    "sample_maps",
                    plot_sample_maps(samples, hour, geographic=geographic),
                    f"{samples.times[hour]}: the predictive mean, three joint samples and one independent sample "
                    "(from the marginals alone) on one colour scale; below, each one's departure from the mean and "
                    "the truth's. An independent sample's departures are noise at every station; a joint sample's "
                    "add the low-rank part, shared by the stations (its share of the variance above).",
                )
            )
        parts.append(
            figure_html(
                "regional_means",
                plot_regional_means(samples),
                "Per hour: the regional mean (the mean of a sample over the hour's targets) of each joint sample, "
                "the predictive of the regional mean from the covariance with its central 90 % interval (shaded), "
                "the one the same marginals give when the stations' errors are taken as independent (dashed, too "
                "narrow where the errors are correlated), and the truth's regional mean.",
            )
        )
    when = ", ".join(samples.times)
    share = samples.low_rank_share()
    return (
        f'<h2 id="joint-samples">Joint samples (low-rank covariance, rank {samples.rank})</h2>'
        f"<p>{SAMPLES:,} samples per hour of the calibrated predictive, joint over the hour's targets, and as "
        f"many independent ones from its marginals, drawn with seed {SEED} over {samples.hours} hour"
        f"{'s' * (samples.hours != 1)} spread over the split: {html.escape(when)}. The low-rank part, shared by "
        f"the targets, holds {share:.0%} of a target's predictive variance on average in these hours; the rest is "
        f"independent per target. {covered}</p>" + "".join(parts)
    )


__all__ = ["joint_section", "plot_regional_means", "plot_sample_maps"]
