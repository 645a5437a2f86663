"""``gridtnp report --compare``: other checkpoints (or fitted recipes) scored on the same tasks as the report's
model, and the page's scorecard, breakdown and observation-impact sections.

* ``resolve_model(spec, runs)``: a checkpoint path, or a recipe (``era5_mos_kriging``, ``recipes/x.yaml``) fitted
  into ``<runs>/<recipe name>/checkpoints`` -> ``(checkpoint, recipe files)``.
* ``recipe_name(configs, ckpt)``: the name a model goes by on the page.
* ``impact_batch(datamodule, split, hours)``: ``hours`` tasks spread over the split as one batch.
* ``comparison_sections(entries, module, datamodule, split, impact_hours)``: the sections' HTML, figures embedded.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from gridtnp.registry import ConfigError
from gridtnp.report.html_parts import figure_html
from gridtnp.training.config_saving import CONFIG_NAME, RECIPE_COMMENT


def recipe_name(configs: list[str | Path], ckpt: Path) -> str:
    """A recipe file's stem (``era5_swin``); for the ``config.yaml`` that ``gridtnp fit`` saves beside the
    checkpoints, the recipe it names in its first lines, else the run folder's name."""
    last = Path(configs[-1]) if configs else Path(ckpt).with_name(CONFIG_NAME)
    if last.name != CONFIG_NAME:
        return last.stem
    try:
        for line in last.read_text().splitlines()[:5]:
            if line.startswith(RECIPE_COMMENT):
                return Path(line.removeprefix(RECIPE_COMMENT).split(",")[-1].strip()).stem
    except OSError:
        pass
    folder = Path(ckpt).resolve().parent
    return folder.parent.name if folder.name == "checkpoints" else folder.name


def resolve_model(spec: str, runs: Path) -> tuple[Path, list[str]]:
    """``--compare`` value -> ``(checkpoint, [recipe])``: a ``.ckpt`` file with the ``config.yaml`` beside it, or a
    recipe name or file whose fit is at ``<runs>/<name>/checkpoints/last.ckpt``."""
    path = Path(spec)
    if path.suffix == ".ckpt":
        if not path.is_file():
            raise ConfigError(f"--compare {spec}: no such checkpoint file.")
        config = path.with_name(CONFIG_NAME)
        if not config.is_file():
            raise ConfigError(
                f"--compare {spec}: no {CONFIG_NAME} beside the checkpoint (gridtnp fit writes it there); compare "
                "checkpoints that gridtnp fit wrote, or name a fitted recipe."
            )
        return path, [str(config)]
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    recipe = path if path.is_file() else Path("recipes") / f"{name}.yaml"
    run = runs / name / "checkpoints"
    ckpt = run / "last.ckpt"
    if not ckpt.is_file():
        raise ConfigError(
            f"--compare {spec}: no fitted checkpoint at {ckpt}. Fit it first (a classical baseline takes minutes on a "
            f"CPU): gridtnp fit --config {recipe} --trainer.default_root_dir {runs / name} --checkpoint.dirpath {run}"
        )
    config = run / CONFIG_NAME
    return ckpt, [str(config if config.is_file() else recipe)]


def impact_batch(datamodule: Any, split: str, hours: int) -> Any:
    """``hours`` tasks spread evenly over the split (the first, the last and evenly between), as one batch."""
    from gridtnp.report.impact import stack_tasks
    from gridtnp.report.plots import task_batch

    loader = datamodule.val_dataloader() if split == "val" else datamodule.test_dataloader()
    dataset = loader.dataset
    tasks = []
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and len(dataset):
        batches = {0: dataset[0]}
        per = batches[0].batch_size
        total = len(getattr(dataset, "hours", ())) or len(dataset) * per  # tasks in the split
        for index in sorted(set(np.linspace(0, total - 1, min(hours, total)).round().astype(int).tolist())):
            b, t = divmod(index, per)
            if b not in batches:
                batches[b] = dataset[b]
            batch = batches[b]
            tasks.append(task_batch(batch, min(t, batch.batch_size - 1)))
    else:
        for batch in loader:
            tasks += [task_batch(batch, i) for i in range(min(batch.batch_size, hours - len(tasks)))]
            if len(tasks) >= hours:
                break
    return stack_tasks(tasks)


def comparison_sections(entries: list[Any], module: Any, datamodule: Any, split: str, impact_hours: int) -> str:
    """The scorecard (``Scored`` ``entries``, the report's model first), who wins where, the breakdowns, and the
    observation-impact map of the report's model over ``impact_hours`` hours (0: none), as HTML."""
    from gridtnp.report.breakdowns import breakdown_html, breakdowns
    from gridtnp.report.scorecard import BASELINE, check_same_tasks, scorecard_html, station_rmse
    from gridtnp.report.scorecard_plots import plot_breakdowns, plot_winners

    check_same_tasks(entries)
    ds = entries[0].physical
    units = str(ds["mean"].attrs.get("units", ""))
    points = np.stack([ds["latitude"].values, ds["longitude"].values], -1).astype(np.float64)
    names = [*(e.name for e in entries), BASELINE]
    items = breakdowns(entries, units)
    parts = [
        f'<h2 id="scorecard-section">Scorecard ({html.escape(split)} split, the same tasks for every model)</h2>',
        scorecard_html(entries, units),
        figure_html(
            "winners",
            plot_winners(points, station_rmse(entries), names),
            "The model with the lowest held-out "
            "RMSE at each station over the split (the coarse cell included); counts in the legend.",
        ),
        '<h2 id="breakdowns">Breakdowns</h2>',
        breakdown_html(items),
        figure_html(
            "breakdown_plots",
            plot_breakdowns(items),
            "Held-out RMSE by hour of day (UTC), by distance to the "
            "nearest context station and coast / inland; calibration (90 % coverage, mean z^2, ideal dashed) "
            "by distance: where the model knows little.",
        ),
    ]
    if impact_hours > 0:
        parts.append(_impact_section(entries[0], module, datamodule, split, impact_hours, points, units))
    return "".join(parts)


def _impact_section(
    entry: Any, module: Any, datamodule: Any, split: str, hours: int, points: np.ndarray, units: str
) -> str:
    """The observation-impact map of ``entry``'s model (``module``) over ``hours`` tasks spread over the split."""
    from gridtnp.report.impact import observation_impact
    from gridtnp.report.scorecard_plots import plot_impact

    source = getattr(module, "target_source", None) or "stations"
    batch = module.transfer_batch_to_device(impact_batch(datamodule, split, hours), module.device, 0)
    if batch.target.x.shape[1] != len(points) or source not in batch.context:
        return (
            '<h2 id="impact">Observation impact</h2><p>Not drawn: it needs tasks whose targets are every station '
            "(<code>targets: all</code>) and a station context source.</p>"
        )
    impact = observation_impact(module, batch, source)
    axis = getattr(datamodule, "time_axis", None)
    if axis is not None:
        when = ", ".join(str(t)[:16] for t in axis[impact.times]) + " UTC"
    else:
        when = f"{len(impact.times)} hours"
    return (
        f'<h2 id="impact">Observation impact ({html.escape(entry.name)})</h2>'
        "<p>Each station held out in an hour is added to that hour's context (one forward per candidate station "
        "and set of hours, candidates batched); the maps show how much the other held-out stations' RMSE and mean "
        "predictive std drop (without minus with; positive: the station helps). Computed over "
        f"{len(impact.times)} hour{'s' * (len(impact.times) != 1)} spread over the split, not the whole split, "
        "to keep it affordable: "
        f"{html.escape(when)}.</p>"
        + figure_html(
            "impact_map",
            plot_impact(points, impact, entry.scale, units),
            "Observation impact per station: drop of the other stations' held-out RMSE (left) and of their mean "
            "predictive std (right) when the station is added to the context; rings: never held out in these hours.",
        )
    )
