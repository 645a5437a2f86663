"""``gridtnp report``: one self-contained HTML page per evaluation of a checkpoint.

The page holds the metric table of the split (as ``gridtnp test`` computes it: all, context and held-out targets,
calibrated and uncalibrated, the baselines beside), the figures of ``gridtnp plot`` embedded as PNG data (no
network and no other file needed to view it), and where it came from: the recipe (with its text), the checkpoint
and its training step.

* ``write_report(cli, ckpt_path, configs, out, split, num_tasks, geographic, others)``: evaluate and write the
  page; with ``others`` (``--compare``) the scorecard, breakdowns and observation impact
  (``gridtnp.report.compare``); for a joint predictive, its samples (``gridtnp.report.joint_plots``).
* ``evaluate(cli, split, num_tasks)``: one checkpoint's ``Evaluation`` and metrics; ``scored(name, evaluation)``.
* ``render_report(...)``: the page as a string; ``metric_table(metrics)``: its table as HTML.
* ``is_report(path)``: whether ``path`` is a page this command wrote (``--overwrite`` replaces nothing else).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import lightning as L

from gridtnp.files import atomic_write
from gridtnp.redaction import redact_text
from gridtnp.report.html_parts import png_data

#: Marks the pages ``gridtnp report`` writes.
GENERATOR = '<meta name="generator" content="gridtnp report">'
#: Column order and titles of the metric table (group prefixes of the metric names).
COLUMNS = {
    "": "all",
    "heldout": "held-out",
    "context": "context",
    "uncalibrated": "all, uncalibrated",
    "uncalibrated/heldout": "held-out, uncalibrated",
    "uncalibrated/context": "context, uncalibrated",
}
#: Figures in page order with their captions (names from ``evaluation_plots.split_figures``; maps come first).
CAPTIONS = {
    "reliability": "Calibration by kind of target: reliability diagram (observed against nominal coverage of the "
    "central intervals), PIT histogram and standardised errors, pooled and for held-out and context targets apart.",
    "station_rmse": "Per-station RMSE over the split's hours, the model's and the coarse-cell baseline's.",
    "station_series": "The truth (ERA5 at the station), the predictive mean and its 90 % interval at three "
    "stations held out in most hours.",
    "standardised_errors": "Standardised errors of every target against N(0, 1).",
}
STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.5em; } h3 { font-size: 1em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; font-family: monospace; }
thead th { background: #e8eef6; } tr.baseline td { background: #f6f6ea; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; } pre { background: #f4f4f4; padding: 0.6em; overflow-x: auto; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; } dt { font-weight: bold; }
"""


def is_report(path: Path) -> bool:
    """A file that ``gridtnp report`` wrote (its generator tag in the first kilobytes)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return GENERATOR in f.read(4096)
    except OSError:
        return False


def _number(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.4f}"


def metric_table(metrics: dict[str, float]) -> str:
    """``{name: value}`` (names as ``gridtnp test`` logs them without the split, e.g. ``heldout/rmse_physical``)
    as an HTML table: one row per metric, one column per group of targets; baseline rows follow the model's."""
    groups: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        group, _, metric = name.rpartition("/")
        groups.setdefault(group, {})[metric] = value
    columns = sorted(groups, key=lambda g: (list(COLUMNS).index(g) if g in COLUMNS else len(COLUMNS), g))
    names = list(dict.fromkeys(m for g in columns for m in groups[g]))
    for name in [n for n in names if n.startswith("baseline_")]:  # beside the metric it is the baseline of
        model = name.removeprefix("baseline_")
        if model in names:
            names.remove(name)
            names.insert(names.index(model) + 1, name)
    head = "".join(f"<th>{html.escape(COLUMNS.get(g, g))}</th>" for g in columns)
    rows = []
    for name in names:
        cells = "".join(f"<td>{_number(groups[g].get(name))}</td>" for g in columns)
        kind = ' class="baseline"' if name.startswith("baseline_") else ""
        rows.append(f"<tr{kind}><td>{html.escape(name)}</td>{cells}</tr>")
    return f"<table><thead><tr><th>metric</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def render_report(
    title: str,
    metrics: dict[str, float],
    figures: dict[str, Any],
    provenance: dict[str, str],
    recipes: dict[str, str],
    split: str,
    sections: str = "",
) -> str:
    """The page: title, provenance, metric table, ``sections`` (HTML: the scorecard of ``--compare``, the joint
    samples), figures
    (maps ``task*`` first), recipe texts."""
    esc = html.escape
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in provenance.items())
    order = [n for n in figures if n.startswith("task")] + [n for n in CAPTIONS if n in figures]
    order += [n for n in figures if n not in order]
    blocks = []
    for name in order:
        caption = CAPTIONS.get(name) or f"{split} {name}: targets, predictive mean, std, errors and the context."
        blocks.append(
            f'<figure id="{esc(name)}"><img alt="{esc(name)}" src="{png_data(figures[name])}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )
    recipe_text = "".join(
        f"<details><summary>{esc(path)}</summary><pre>{esc(text)}</pre></details>" for path, text in recipes.items()
    )
    notes = (
        "<p>Metrics as <code>gridtnp test</code> logs them, in normalised units (the target variable divided by its "
        "training std) unless named <code>*_physical</code> (the target variable's units). The truth is ERA5 at the "
        "station locations. held-out: targets that were not in the context; context: targets that were also "
        "context points; uncalibrated: before the variance calibration (the model's own std). baseline_*: the "
        "coarse cell's value at each target. calibration_scale multiplies the predictive std of held-out targets, "
        "calibration_scale_observed that of targets on a context station (there the model nearly returns the value "
        "it was given, so their std gets a scale of its own).</p>"
    )
    table = metric_table(metrics) if metrics else "<p>No metrics were logged.</p>"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><dl>{facts}</dl>"
        f'<h2>Metrics ({esc(split)} split)</h2><div id="metrics">{table}</div>{notes}'
        f"{sections}<h2>Figures</h2>{''.join(blocks)}<h2>Recipe</h2>{recipe_text}</body></html>\n"
    )


class _Collect(L.Callback):
    """Gathers every evaluation batch's outputs into an ``Evaluation``, from the predictive the test (or
    validation) step computed (a forward hook keeps it: no second forward pass)."""

    def __init__(self, evaluation: Any, num_tasks: int) -> None:
        self.evaluation, self.num_tasks = evaluation, num_tasks
        self.dist: Any = None
        self.handle: Any = None

    def _keep(self, module: Any, args: Any, output: Any) -> None:
        self.dist = output

    def _start(self, pl_module: Any) -> None:
        self.handle = pl_module.register_forward_hook(self._keep)

    def _add(self, pl_module: Any, batch: Any) -> None:
        self.evaluation.add(pl_module, batch, self.num_tasks - len(self.evaluation.tasks), self.dist)
        self.dist = None

    def _end(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(pl_module)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        self._add(pl_module, batch)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._end()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(pl_module)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if not trainer.sanity_checking:
            self._add(pl_module, batch)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._end()


def evaluate(cli: Any, split: str, num_tasks: int) -> tuple[Any, dict[str, float]]:
    """``cli.model`` (weights loaded) on ``cli.datamodule``'s ``split`` with ``cli.trainer``: the ``Evaluation``
    (physical units converted) and the metrics of ``gridtnp test`` without the split prefix."""
    import torch

    from gridtnp.report.evaluation import Evaluation

    module, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    evaluation = Evaluation(split, calibrated=bool(getattr(module, "variance_calibration", False)))
    trainer.callbacks.append(_Collect(evaluation, num_tasks))
    if split == "test":
        trainer.test(module, datamodule=datamodule, verbose=False)
    else:  # validate refits the variance calibration on the split: keep the checkpoint's
        kept = {k: v.clone() for k, v in module.state_dict().items() if k.startswith("std_scale")}
        trainer.validate(module, datamodule=datamodule, verbose=False)
        with torch.no_grad():
            for k, v in kept.items():
                module.get_buffer(k).copy_(v)
    metrics = {
        name.removeprefix(f"{split}/"): float(value)
        for name, value in trainer.callback_metrics.items()
        if name.startswith(f"{split}/")
    }
    evaluation.convert(datamodule)
    return evaluation, metrics


def scored(name: str, evaluation: Any) -> Any:
    """An ``Evaluation`` of station tasks as a ``gridtnp.report.scorecard.Scored`` named ``name``; ``ConfigError``
    where it has no station Dataset in physical units (a scorecard compares station predictions)."""
    from gridtnp.registry import ConfigError
    from gridtnp.report.scorecard import Scored

    physical = evaluation.physical
    if physical is None or "station" not in physical.dims or "observed" not in physical:
        raise ConfigError(
            f"--compare: {name!r} gives no station predictions in physical units; the scorecard compares models of "
            "station tasks (e.g. recipes/era5_swin.yaml, era5_mos, era5_mos_kriging)."
        )
    scale = evaluation.outputs[0].get("target_scale")
    return Scored(name, physical, float(scale[0]) if scale is not None else 1.0)


def write_report(
    cli: Any,
    ckpt_path: Path,
    configs: list[str],
    out: Path,
    split: str,
    num_tasks: int,
    geographic: bool | None,
    others: list[tuple[Any, Path, list[str]]] | None = None,
    impact_hours: int = 4,
    sample_hours: int = 4,
) -> Path:
    """Evaluate ``cli.model`` (weights loaded) on ``cli.datamodule``'s ``split`` with ``cli.trainer`` (the metrics of
    ``gridtnp test``), draw ``gridtnp plot``'s figures and write the page to ``out``; with ``others`` (loaded CLIs,
    their checkpoints and recipes), a scorecard of all on the same tasks, breakdowns and the observation-impact map
    of ``cli.model`` over ``impact_hours`` hours; joint samples over ``sample_hours`` hours (0: none)."""
    from gridtnp.report.compare import comparison_sections, recipe_name
    from gridtnp.report.evaluation_plots import split_figures
    from gridtnp.report.joint_plots import joint_section
    from gridtnp.training.checkpointing import checkpoint_step

    module, datamodule = cli.model, cli.datamodule
    evaluation, metrics = evaluate(cli, split, num_tasks)
    figures = split_figures(evaluation, module, datamodule, geographic)
    name = recipe_name(configs, ckpt_path)
    sections = ""
    if others:
        entries = [scored(name, evaluation)]
        for other, other_ckpt, other_configs in others:
            entries.append(scored(recipe_name(other_configs, other_ckpt), evaluate(other, split, 0)[0]))
        sections = comparison_sections(entries, module, datamodule, split, impact_hours)
    sections += joint_section(module, datamodule, split, metrics, evaluation.num_tasks, sample_hours)
    model = type(getattr(module, "model", module)).__name__
    recipes = {str(c): redact_text(Path(c).read_text()) for c in configs if Path(c).is_file()}
    provenance = {
        "recipe": f"{name} ({', '.join(str(c) for c in configs)})",
        "checkpoint": str(ckpt_path),
        "training step": str(checkpoint_step(ckpt_path)),
        "model": f"{model} ({sum(p.numel() for p in module.parameters() if p.requires_grad):,} trainable parameters)",
        "data": f"{type(datamodule).__name__}, {split} split: {evaluation.num_tasks} tasks",
    }
    for _, other_ckpt, other_configs in others or []:
        provenance[f"compared: {recipe_name(other_configs, other_ckpt)}"] = (
            f"{other_ckpt} (step {checkpoint_step(other_ckpt)}, {', '.join(str(c) for c in other_configs)})"
        )
    if evaluation.physical is None:
        provenance["units"] = "normalised (this DataModule gives no conversion to physical units)"
    title = f"gridtnp evaluation: {name} ({model}), {split} split, {Path(ckpt_path).name}"
    page = render_report(title, metrics, figures, provenance, recipes, split, sections)
    atomic_write(out, lambda f: f.write(page.encode("utf-8")))
    return out
