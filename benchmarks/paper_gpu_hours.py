"""GPU-hours to train every row of the gridded TNP paper's Tables 1-4 for the paper's steps, from recorded results
only (nothing is measured here); the Markdown section of ``docs/reproduce.md`` between ``<!-- gpu-hours -->`` and
``<!-- end gpu-hours -->``. Run through ``python benchmarks/paper_recipes_cost.py --plan [--write | --check]``.

A row's training-step time is, first found:

1. measured on a GPU: a ``gridtnp fit (consumed)`` row of ``results/gpu_training_*.csv`` whose command trains
   ``recipes/paper/<recipe>.yaml`` (its "step N ms"), else a ``results/paper_recipes_cost_*.csv`` row measured on
   a GPU (1,000 / its steps/s);
2. estimated: the paper's forward-pass time (FPT) x the training-step / forward ratio gridtnp measured on the CPU
   for the same recipe (``step_cpu_ms / forward_cpu_ms`` of ``results/paper_recipes_cost_*.csv``), or for the
   recipe that ``paper_training_budget.yaml`` names in ``ratio_from`` where the row has no CPU measurement.

GPU-hours = the paper's steps x step time x the trainings a row needs (``runs``). Validation is counted only where
the paper states its cadence (it does for no table); the recipes' own cadence is shown beside, not in the total.
"""

from __future__ import annotations

import csv
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ROOT / "benchmarks" / "paper_training_budget.yaml"
RESULTS = ROOT / "benchmarks" / "results"
RECIPES = ROOT / "recipes" / "paper"
DOC = ROOT / "docs" / "reproduce.md"
MARKER = re.compile(r"(<!-- gpu-hours -->\n)(?P<body>.*?)(<!-- end gpu-hours -->)", re.DOTALL)
STALE = 0.10  # a CPU measurement of a model this far from the paper's size is flagged with its size
COMMAND = "python benchmarks/paper_recipes_cost.py --plan --write"
WIDTH = 115  # the line length of the docs' prose


@dataclass
class Row:
    """One recipe's planned training: steps, step time in ms and where that time comes from."""

    recipe: str
    steps: int
    fpt_ms: float
    step_ms: float | None
    measured: str | None  # the GPU and file of a measured step time; None for an estimate
    ratio: float | None
    ratio_note: str
    runs: int
    validation_h: float | None  # the recipe's own validation at the paper's FPT, all runs

    @property
    def hours(self) -> float | None:
        return None if self.step_ms is None else self.steps * self.step_ms * self.runs / 3.6e6

    @property
    def forward_hours(self) -> float:
        return self.steps * self.fpt_ms * self.runs / 3.6e6


def _number(value: str | None) -> float | None:
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def cpu_ratios(results: Path = RESULTS) -> dict[str, tuple[float, int]]:
    """Recipe (without ``.yaml``) -> (CPU training-step / forward ratio, parameters of the measured model)."""
    out: dict[str, tuple[float, int]] = {}
    for path in sorted(results.glob("paper_recipes_cost_*.csv")):  # a later file overrides an earlier one
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                fwd, step = _number(r.get("forward_cpu_ms")), _number(r.get("step_cpu_ms"))
                if str(r.get("device", "")).startswith("CPU") and fwd and step:
                    out[r["recipe"].removesuffix(".yaml")] = (step / fwd, int(r["params"]))
    return out


def gpu_steps(results: Path = RESULTS) -> dict[str, tuple[float, str]]:
    """Recipe -> (training-step ms measured on a GPU, "<GPU>, `<result file>`"); ``gpu_training`` rows win."""
    out: dict[str, tuple[float, str]] = {}
    for path in sorted(results.glob("paper_recipes_cost_*.csv")):
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                rate = _number(r.get("steps_per_s"))
                if not str(r.get("device", "CPU")).startswith("CPU") and rate:
                    out[r["recipe"].removesuffix(".yaml")] = (1e3 / rate, f"{r['device']}, `{path.name}`")
    for path in sorted(results.glob("gpu_training_*.csv")):
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                recipe = re.search(r"recipes/paper/(\w+)\.yaml", r.get("command", ""))
                step = re.search(r"step ([\d.,]+) ms", r.get("notes", ""))
                if r.get("measure") == "gridtnp fit (consumed)" and recipe and step:
                    out[recipe.group(1)] = (float(step.group(1).replace(",", "")), f"{r['device']}, `{path.name}`")
    return out


def validation_passes(recipe: str, steps: int) -> int | None:
    """Validation forward passes (batches) the recipe runs in ``steps`` steps; None when it sets no cadence."""
    config = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())
    trainer = config.get("trainer", {})
    loader = config.get("data", {}).get("init_args", {}).get("loader", {})
    every, batches = trainer.get("val_check_interval"), trainer.get("limit_val_batches", loader.get("val_batches"))
    if not isinstance(every, int) or not isinstance(batches, int):
        return None
    return steps // every * batches


def plan(
    budget: dict[str, Any], ratios: dict[str, tuple[float, int]], measured: dict[str, tuple[float, str]]
) -> dict[str, list[Row]]:
    """Table name -> its rows' planned training, from the budget file and the recorded measurements."""
    specs = {recipe: spec for table in budget["tables"].values() for recipe, spec in table["rows"].items()}
    tables: dict[str, list[Row]] = {}
    for name, table in budget["tables"].items():
        rows = []
        for recipe, spec in table["rows"].items():
            steps, fpt = int(spec.get("steps", table["steps"])), float(spec["fpt_ms"])
            source = spec.get("ratio_from", recipe)
            ratio, params = ratios.get(source, (None, 0))
            note = "no measurement"
            if ratio is not None:
                note = f"{ratio:.2f}" + (f" (of `{source}`)" if source != recipe else "")
                paper_m = specs[source]["params_m"]
                if abs(params / 1e6 - paper_m) > STALE * paper_m:
                    note += f" (at {params / 1e6:.2f} M)"
            step_ms, where = measured.get(recipe, (None, None))
            if step_ms is None and ratio is not None:
                step_ms = fpt * ratio
            passes = validation_passes(recipe, steps)
            val_h = None if passes is None else passes * fpt * table["runs"] / 3.6e6
            rows.append(Row(recipe, steps, fpt, step_ms, where, ratio, note, int(table["runs"]), val_h))
        tables[name] = rows
    return tables


def _h(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def render(budget: dict[str, Any], tables: dict[str, list[Row]]) -> str:
    """The Markdown section: a totals table, then one table per paper table."""
    n_measured = sum(r.measured is not None for rows in tables.values() for r in rows)
    n_rows = sum(len(rows) for rows in tables.values())
    intro = (
        f"Generated by `{COMMAND}` from `benchmarks/paper_training_budget.yaml` (the paper's steps, FPT and GPU per "
        "row, each with the sentence it comes from) and the result files under `benchmarks/results/`. "
        f"**Measured** on a GPU: the training-step time of {n_measured} of the {n_rows} rows. Every other step time "
        "is an **estimate**: the paper's FPT x the training-step / forward ratio gridtnp measured on the CPU for the "
        'same recipe (`paper_recipes_cost_cpu_*_1thread.csv`; "of `x`": the ratio of recipe x, where this one ran '
        'out of memory; "at N M": measured on a model of N M parameters, over 10 % from the paper\'s size, before '
        "the recipe took the paper's size). A GPU run of `benchmarks/gpu_training.py` on a paper recipe, or of "
        "`benchmarks/paper_recipes_cost.py --device cuda`, replaces the estimate once its result file is under "
        "`benchmarks/results/` and this section is rendered again. GPU h = steps x step time x trainings per row: "
        "for an estimate, on the GPU the paper trained on (its appendix D; the FPT captions do not name the GPU "
        "that timed them); for a measurement, on the GPU it names. "
        "Validation is not counted: the paper states no cadence; the last column is what the recipes' own cadence "
        "(`val_check_interval`, validation batches) adds at the FPT."
    )
    lines = [
        *textwrap.wrap(intro, WIDTH, break_on_hyphens=False, break_long_words=False),
        "",
        "| table | paper's GPU | rows | trainings per row | GPU h | of which measured | forward passes alone, h "
        "| recipes' validation, h (not counted) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    every = [r for rows in tables.values() for r in rows]
    for name, rows in [*tables.items(), ("all", every)]:
        table = budget["tables"].get(name, {"title": "all", "gpu": "", "runs": ""})
        lines.append(
            f"| {table['title'].split(':')[0]} | {table['gpu']} | {len(rows)} | {table['runs']} "
            f"| {_h(_sum([r.hours for r in rows]))} | {_h(sum(r.hours or 0.0 for r in rows if r.measured))} "
            f"| {_h(sum(r.forward_hours for r in rows))} | {_h(_sum([r.validation_h for r in rows]))} |"
        )
    for name, rows in tables.items():
        table = budget["tables"][name]
        runs = f"; {table['runs']} trainings per row, {table['runs_source']}" if table["runs"] > 1 else ""
        lines += [
            "",
            f"**{table['title']}**: {table['steps']:,} steps of batch 8 ({table['steps_source'].split(':')[0]}), "
            f"on an {table['gpu']} ({table['gpu_source'].split(':')[0]}){runs}.",
            "",
            "| recipe | steps | paper FPT ms | step / forward (gridtnp, CPU) | step ms | step time | GPU h |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            kind = f"measured: {r.measured}" if r.measured else "estimate"
            lines.append(
                f"| `{r.recipe}` | {r.steps:,} | {r.fpt_ms:g} | {r.ratio_note} | {_h(r.step_ms)} | {kind} "
                f"| {_h(r.hours)} |"
            )
        lines.append(f"| total | | | | | | {_h(_sum([r.hours for r in rows]))} |")
    return "\n".join(lines) + "\n"


def section(results: Path = RESULTS, budget_path: Path = BUDGET) -> str:
    """The section's Markdown from the budget file and the result files under ``results``."""
    budget = yaml.safe_load(budget_path.read_text())
    return render(budget, plan(budget, cpu_ratios(results), gpu_steps(results)))


def update(doc: Path, body: str, write: bool) -> bool:
    """Whether ``doc``'s marked section equals ``body``; with ``write``, replace it when it does not."""
    text = doc.read_text()
    match = MARKER.search(text)
    if match is None:
        raise SystemExit(f"{doc.name}: no '<!-- gpu-hours -->' ... '<!-- end gpu-hours -->' section to render into")
    if match.group("body") == body:
        return True
    if write:
        doc.write_text(text[: match.start("body")] + body + text[match.end("body") :])
    return False
