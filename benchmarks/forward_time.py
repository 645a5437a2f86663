"""Forward (and forward + backward) time and peak memory of models: recipes or presets as the context grows, or the
gridded TNP paper's models and task shapes (``--suite paper``).

    python benchmarks/forward_time.py --recipe recipes/gp2d_convcnp.yaml --num-context 1000 10000 100000
    python benchmarks/forward_time.py --preset tnp --num-context 100 1000 --backward --small
    python benchmarks/forward_time.py --suite paper                  # batch 8, every model of the paper's tables
    python benchmarks/forward_time.py --suite paper --small --threads 1

Recipes and presets: inputs are random and shaped like the model's task: ``dim_x`` and each source's ``dim_y``
come from the model, context and target ``x`` are uniform in the model grid's bounds (``[-2, 2]^Dx`` for grid-free
models), ``y`` is standard normal, every source gets ``N_c`` points.

``--suite paper``: the forward-pass time at batch 8 of each model of the gridded TNP paper's tables, on inputs
shaped like its tasks (``paper_suite`` documents them): the 2-D GP (N_c = 10,000, N_t = 1,000), the station task
with pseudo-tokens on 64 x 128 and 192 x 384 (a global 1 degree on-the-grid field plus 2,987 stations as context,
6,970 stations as targets) and the wind task on a 4 x 24 x 60 grid.

Each configuration is run ``--warmup`` times, then timed ``--repeats`` times (synchronising on CUDA); the median is
reported. Results: a Markdown table, a CSV and a PNG plot with the same stem (``harness.Report``).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
import torch
import yaml
from torch import Tensor, nn

from gridtnp import NeuralProcessModule, Observations, count_parameters, create_model
from gridtnp.models import build_model
from gridtnp.models.neural_process import NeuralProcess
from gridtnp.nn.grids import Grid

ROOT = harness.ROOT


@dataclass
class Row:
    """One measured configuration."""

    model: str
    params: int
    batch_size: int
    num_context: int
    num_targets: int
    passes: str
    median_ms: float | None
    min_ms: float | None
    peak_mib: float | None
    repeats: int
    note: str = ""
    task: str = ""


# ----------------------------------------------------------------------------------------------- building models


def model_from_recipe(path: Path) -> NeuralProcess:
    """The ``NeuralProcess`` that ``gridtnp fit --config path`` would train."""
    return NeuralProcessModule(**recipe_model_args(path)).model


def recipe_model_args(path: Path) -> dict[str, Any]:
    """A recipe's ``model.init_args``."""
    if not path.is_file():
        raise SystemExit(
            f"--recipe {path}: no such file. Recipes: {', '.join(sorted(map(str, ROOT.glob('recipes/*.yaml'))))}"
        )
    config = yaml.safe_load(path.read_text()) or {}
    init_args = (config.get("model") or {}).get("init_args")
    if not isinstance(init_args, dict):
        raise SystemExit(f"--recipe {path}: expected a 'model: {{init_args: {{...}}}}' section as in recipes/*.yaml.")
    return init_args


def model_from_preset(name: str, dim_x: int | None, dim_y: int | None) -> NeuralProcess:
    """A registered preset (``gridtnp list model``), optionally with another ``dim_x`` / ``dim_y``."""
    kwargs = {k: v for k, v in {"dim_x": dim_x, "dim_y": dim_y}.items() if v is not None}
    return create_model(name, **kwargs)


# ---------------------------------------------------------------------------------------------------- inputs


def uniform_x(lower: list[float], upper: list[float], b: int, n: int, device: torch.device) -> Tensor:
    """``[b, n, Dx]`` uniform in the box ``[lower, upper]``."""
    lo, hi = torch.tensor(lower, device=device), torch.tensor(upper, device=device)
    return lo + (hi - lo) * torch.rand(b, n, len(lower), device=device)


def model_box(model: NeuralProcess) -> tuple[list[float], list[float]]:
    """The model grid's bounds, or ``[-2, 2]^Dx`` without a grid."""
    grid = model.grid
    if grid is None:
        return [-2.0] * model.dim_x, [2.0] * model.dim_x
    return list(grid.lower), list(grid.upper)


@dataclass
class Workload:
    """Inputs of one measurement: per source either ``n`` random points in ``box`` or the points of a ``Grid``."""

    sources: dict[str, int | Grid]
    num_targets: int
    box: tuple[list[float], list[float]]

    @property
    def num_context(self) -> int:
        return sum(s.num_points if isinstance(s, Grid) else int(s) for s in self.sources.values())

    def build(self, model: NeuralProcess, b: int, device: torch.device) -> tuple[dict[str, Observations], Tensor]:
        """Context for every source of the model, and target locations, on ``device``."""
        context = {}
        for name, encoder in model.encoders.items():
            spec = self.sources[name]
            if isinstance(spec, Grid):
                x = spec.points(device).reshape(1, -1, spec.ndim).expand(b, -1, -1).contiguous()
            else:
                x = uniform_x(*self.box, b, int(spec), device)
            context[name] = Observations(x, torch.randn(b, x.shape[1], encoder.dim_y, device=device))
        return context, uniform_x(*self.box, b, self.num_targets, device)


# ------------------------------------------------------------------------------------------------ measuring


def make_call(
    kind: str, model: nn.Module, runner: nn.Module, context: dict[str, Observations], xt: Tensor, bf16: bool
) -> Callable[[], None]:
    """One call of ``kind``: ``forward`` (no grad, eval mode) or ``forward+backward`` (train mode)."""
    device = xt.device
    model.train(kind != "forward")
    if kind == "forward":

        def forward() -> None:
            with torch.no_grad(), harness.autocast(device, bf16):
                runner(context, xt)

        return forward
    yt: list[Tensor] = []  # the targets' y, drawn once the first call tells the output shape

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        with harness.autocast(device, bf16):
            dist = runner(context, xt)
            if not yt:
                yt.append(torch.randn(dist.mean.shape, device=device))
            loss = -dist.log_prob(yt[0]).float().mean()
        loss.backward()

    return forward_backward


def benchmark_model(
    label: str,
    model: NeuralProcess,
    workloads: list[Workload],
    args: argparse.Namespace,
    device: torch.device,
    task: str = "",
) -> list[Row]:
    """Rows for every workload (and pass) of one model, in order of size; larger workloads are skipped after an OOM
    or a slow call."""
    model = model.to(device)
    params = count_parameters(model)
    runner = harness.maybe_compile(model, args.compile)
    passes = ["forward", "forward+backward"] if args.backward else ["forward"]
    stopped: dict[str, str] = {}
    history: dict[str, list[tuple[float, float]]] = {kind: [] for kind in passes}
    rows = []
    for work in workloads:
        torch.manual_seed(0)
        context, xt = work.build(model, args.batch_size, device)
        n_c = work.num_context
        for kind in passes:
            row = Row(label, params, args.batch_size, n_c, work.num_targets, kind, None, None, None, 0, task=task)
            predicted = harness.predict_ms(history[kind], n_c)
            if kind not in stopped and predicted > 1e3 * args.max_call_seconds:
                stopped[kind] = f"skipped: predicted {predicted / 1e3:,.0f} s per call > --max-call-seconds"
            if kind in stopped:
                row.note = stopped[kind]
            else:
                call = make_call(kind, model, runner, context, xt, args.bf16)
                try:
                    times, row.peak_mib, row.note = harness.measure(
                        call, device, args.warmup, args.repeats, args.max_call_seconds
                    )
                    row.median_ms, row.min_ms, row.repeats = statistics.median(times), min(times), len(times)
                    history[kind].append((n_c, row.median_ms))
                    if row.note:
                        stopped[kind] = f"skipped: N_c = {n_c:,} was already too slow"
                except Exception as err:
                    if not harness.is_out_of_memory(err):
                        raise
                    row.note, stopped[kind] = "out of memory", f"skipped: out of memory at N_c = {n_c:,}"
                del call
                model.zero_grad(set_to_none=True)
                harness.free(device)
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------------- paper suite


def global_grid(shape: tuple[int, int]) -> Grid:
    """Cell centres of a global ``shape`` (lat x lon) grid, longitude rolled."""
    step = 180.0 / shape[0]
    return Grid([-90.0 + step / 2, -180.0], [90.0 - step / 2, 180.0], shape, roll=[False, True])


def station_spec(shape: tuple[int, int], merge: str) -> dict[str, Any]:
    """``recipes/era5_swin_global.yaml``'s model with pseudo-tokens on ``shape``; ``merge`` single or multi."""
    spec = dict(recipe_model_args(ROOT / "recipes" / "era5_swin_global.yaml"))
    spec["grid"] = {**spec["grid"], "shape": list(shape)}
    if merge == "multi":
        spec["grid_encoder"] = {"name": "multi", "encoder": {"name": "pseudo_token"}, "merge": "concat"}
    return spec


def wind_spec(name: str) -> dict[str, Any]:
    """A model for the wind task: 3-D inputs (time, lat, lon), outputs (u, v), grid 4 x 24 x 60."""
    grid = {"lower": [0.0, 30.0, -30.0], "upper": [3.0, 53.0, 29.0], "shape": [4, 24, 60]}
    if name == "convcnp":
        return {"preset": "convcnp", "dim_x": 3, "dim_y": 2, "grid": grid}
    return {
        "dim_x": 3,
        "dim_y": 2,
        "grid": grid,
        "encoder": {"name": "mlp"},
        "grid_encoder": {"name": "pseudo_token"},
        "processor": {"name": "swin", "layers": 5, "window": [2, 4, 4], "shift": [1, 2, 2]},
        "grid_decoder": {"name": "knn", "k": 9},
        "likelihood": {"name": "gaussian"},
    }


GP2D_RECIPES = (
    "gp2d_swin_pt",
    "gp2d_swin_ki",
    "gp2d_swin_avg",
    "gp2d_swin_pt_64",
    "gp2d_vit_pt",
    "gp2d_vit_ki",
    "gp2d_vit_pt_patch",
    "gp2d_convcnp",
    "gp2d_pt_tnp",
)


def paper_suite(small: bool) -> list[tuple[str, str, Callable[[], NeuralProcess], Workload]]:
    """``(task, model label, builder, workload)`` for every model of the gridded TNP paper's tables (our reading).

    * 2-D GP: the ``gp2d_*`` recipes (the paper's models at 32 x 32, plus Swin-TNP at 64 x 64), N_c = 10,000 uniform
      points in [-6, 6]^2, N_t = 1,000 (``--small``: N_c = 1,000, N_t = 250).
    * Station task: Swin-TNP PT-GE with 9-NN decoding, pseudo-tokens on 64 x 128 and 192 x 384, one grid for both
      sources ("single", ``era5_swin_global``) or one per source ("multi"); context: the global 1 degree field
      (180 x 360 = 64,800 points) and 2,987 stations, 6,970 target stations (``--small``: 3 x 6 degree field,
      300 stations, 700 targets).
    * Wind task: 3-D inputs (time, lat, lon) and the two horizontal wind components, pseudo-tokens on 4 x 24 x 60;
      Swin-TNP PT-GE (windows 2 x 4 x 4) and a ConvCNP; N_c = 10,000 scattered points, N_t = 1,000
      (``--small``: 1,000 and 250). The paper's inputs for this task are richer; the shapes here are ours.
    """
    entries = []
    n_c, n_t = (1_000, 250) if small else (10_000, 1_000)
    gp_box = ([-6.0, -6.0], [6.0, 6.0])
    for name in GP2D_RECIPES:
        path = ROOT / "recipes" / f"{name}.yaml"
        entries.append(
            ("2-D GP", name, lambda path=path: model_from_recipe(path), Workload({"points": n_c}, n_t, gp_box))
        )
    field = global_grid((60, 60) if small else (180, 360))
    stations, targets = (300, 700) if small else (2_987, 6_970)
    box = ([-90.0, -180.0], [90.0, 180.0])
    for shape in ((64, 128), (192, 384)):
        for merge in ("single", "multi"):
            label = f"Swin-TNP PT-GE {merge}, {shape[0]} x {shape[1]}"
            work = Workload({"grid": field, "stations": stations}, targets, box)
            entries.append(
                (
                    f"stations {shape[0]} x {shape[1]}",
                    label,
                    lambda s=shape, m=merge: NeuralProcessModule(**station_spec(s, m)).model,
                    work,
                )
            )
    wind_box = ([0.0, 30.0, -30.0], [3.0, 53.0, 29.0])
    for name, label in (("swin", "Swin-TNP PT-GE, 4 x 24 x 60"), ("convcnp", "ConvCNP, 4 x 24 x 60")):
        work = Workload({"points": n_c}, n_t, wind_box)
        entries.append(("wind 4 x 24 x 60", label, lambda name=name: build_model(wind_spec(name)), work))
    return entries


# --------------------------------------------------------------------------------------------------- reporting


def format_row(row: Row) -> str:
    return (
        f"{row.model:>32} | B={row.batch_size} N_c={row.num_context:>7,} N_t={row.num_targets:,} | {row.passes:>16} | "
        f"median {harness.fmt(row.median_ms):>10} ms | peak {harness.fmt(row.peak_mib):>8} MiB {row.note}"
    )


def columns(rows: list[Row], suite: bool) -> dict[str, Callable[[dict[str, Any]], str]]:
    """Table columns; ``x first N_c`` (median relative to the smallest N_c of the same model and pass) for sweeps."""
    firsts: dict[tuple[str, str], float | None] = {}
    for row in rows:
        firsts.setdefault((row.model, row.passes), row.median_ms)

    def ratio(r: dict[str, Any]) -> str:
        first = firsts[(r["model"], r["passes"])]
        return harness.fmt(None if r["median_ms"] is None or not first else r["median_ms"] / first, 2)

    cols: dict[str, Callable[[dict[str, Any]], str]] = {"task": lambda r: r["task"]} if suite else {}
    cols.update(
        {
            "model": lambda r: r["model"],
            "params": lambda r: f"{r['params']:,}",
            "B": lambda r: str(r["batch_size"]),
            "N_c": lambda r: f"{r['num_context']:,}",
            "N_t": lambda r: f"{r['num_targets']:,}",
            "pass": lambda r: r["passes"],
            "median ms": lambda r: harness.fmt(r["median_ms"]),
            "min ms": lambda r: harness.fmt(r["min_ms"]),
        }
    )
    if not suite:
        cols["x first N_c"] = ratio
    cols.update({"peak MiB": lambda r: harness.fmt(r["peak_mib"]), "note": lambda r: r["note"]})
    return cols


def plot(path: Path, rows: list[Row], suite: bool, meta: dict[str, str]) -> Path:
    """Median time against N_c per model and pass, or (suite) a horizontal bar chart of the forward times."""
    if not suite:
        series: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            series.setdefault(f"{r.model} ({r.passes})", []).append((r.num_context, r.median_ms))
        return harness.line_plot(path, series, "N_c", "median ms per call", f"{meta['device']}, {meta['precision']}")
    from matplotlib.figure import Figure

    timed = [r for r in rows if r.passes == "forward"]
    fig = Figure(figsize=(9, 0.35 * len(timed) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    labels = [f"{r.task}: {r.model}" for r in timed]
    values = [r.median_ms or 0.0 for r in timed]
    ax.barh(range(len(timed)), values, color=[f"C{hash(r.task) % 10}" for r in timed])
    ax.set_yticks(range(len(timed)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("forward ms (median; 0 = not measured)")
    ax.set_title(f"forward time, batch {timed[0].batch_size if timed else '-'}: {meta['device']}", fontsize=9)
    path = path.with_suffix(".png")
    fig.savefig(path, dpi=110)
    return path


# -------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_argument_group("models (at least one of these)")
    what.add_argument(
        "--recipe", nargs="+", type=Path, default=[], help="recipe YAML file(s), e.g. recipes/gp2d_convcnp.yaml"
    )
    what.add_argument("--preset", nargs="+", default=[], help="model preset name(s) (gridtnp list model)")
    what.add_argument("--suite", choices=["paper"], help="the gridded TNP paper's models and task shapes")
    what.add_argument(
        "--match", nargs="+", default=[], help="only the suite entries whose task or model contains one of these"
    )
    what.add_argument("--dim-x", type=int, help="dim_x for presets (default: the preset's)")
    what.add_argument("--dim-y", type=int, help="dim_y for presets (default: the preset's)")
    parser.add_argument("--batch-size", type=int, help="default 8 (2 with --small)")
    parser.add_argument("--num-context", type=int, nargs="+", help="N_c values; default 1000 10000 100000")
    parser.add_argument("--num-targets", type=int, default=1_000)
    parser.add_argument("--backward", action="store_true", help="also time forward + backward of the log-likelihood")
    harness.add_common_arguments(parser, "forward_time")
    args = parser.parse_args(argv)
    if not args.recipe and not args.preset and not args.suite:
        parser.error("give --recipe FILE..., --preset NAME... (see `gridtnp list model`) and/or --suite paper")
    # --small only changes what was not given explicitly, so `--small --num-context 100 1000` works.
    small = {"batch_size": 2, "num_context": [100, 1_000, 10_000]}
    full = {"batch_size": 8, "num_context": [1_000, 10_000, 100_000]}
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.batch_size, args.num_targets, *args.num_context) < 1:
        parser.error("--batch-size, --num-context and --num-targets must be >= 1")
    stem = "forward_time_paper" if args.suite and not (args.recipe or args.preset) else "forward_time"
    harness.finish_common_arguments(parser, args, stem, repeats=(2, 10))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    jobs: list[tuple[str, str, Callable[[], NeuralProcess], list[Workload] | None]] = [
        ("", path.stem, lambda path=path: model_from_recipe(path), None) for path in args.recipe
    ] + [("", name, lambda name=name: model_from_preset(name, args.dim_x, args.dim_y), None) for name in args.preset]
    if args.suite == "paper":
        jobs += [
            (task, label, build, [work])
            for task, label, build, work in paper_suite(args.small)
            if not args.match or any(m in f"{task} {label}" for m in args.match)
        ]
    meta = harness.metadata(
        args,
        device,
        forward="torch.no_grad(), model.eval(); forward+backward: model.train(), -log_prob(y_t).mean().backward()",
    )
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    rows: list[Row] = []
    for task, label, build, workloads in jobs:
        model = build()
        print(
            f"{label}: {count_parameters(model):,} parameters, dim_x = {model.dim_x}, grid = {model.grid}", flush=True
        )
        if workloads is None:  # a sweep over N_c, every source with N_c random points in the model's box
            box = model_box(model)
            workloads = [
                Workload(dict.fromkeys(model.encoders, n_c), args.num_targets, box) for n_c in args.num_context
            ]
        rows += benchmark_model(label, model, workloads, args, device, task)
        del model
    suite = any(task for task, *_ in jobs)
    report = harness.Report("Forward time", meta)
    for row in rows:
        report.add(asdict(row))
    cols = columns(rows, suite)
    written = report.write(args.out, cols)
    written.append(plot(args.out, rows, suite, meta))
    print("\n" + report.markdown(cols) + "\nwritten: " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
