"""Cost of the gridded TNP paper's recipes (recipes/paper/) on this machine: forward time and training steps/s at
the recipe's batch size (the paper's 8), on inputs shaped like the recipe's task.

    python benchmarks/paper_recipes_cost.py table4                  # recipes whose name starts with table4
    python benchmarks/paper_recipes_cost.py table3_cnp table3_vit_pt_16x16 --repeats 2 --threads 2
    python benchmarks/paper_recipes_cost.py table3 --device cuda --warmup 3 --repeats 10 \
        --out benchmarks/results/paper_recipes_cost_cuda_table3.md
    python benchmarks/paper_recipes_cost.py --plan            # GPU-hours per table from the recorded results
    python benchmarks/paper_recipes_cost.py --plan --write    # ... rendered into docs/reproduce.md
    python benchmarks/paper_recipes_cost.py --plan --check    # exit 1 if docs/reproduce.md's section is stale

Inputs per DataModule: ``SyntheticDataModule``: a batch drawn from the recipe's task itself (the 2-D GP tasks);
``StationReanalysisDataModule``: the coarse grid context of 180 x 360 one-degree block centres (64,800 points),
``round(share x 9,957)`` station context points at the middle of the recipe's ``context_fraction``, and 9,957
station targets, at uniformly random points on the sphere; ``MultiSourceDataModule``: per source ``round(share x
4 x 97 x 237)`` context points at the middle of ``context_fraction`` and ``target_fraction x 4 x 97 x 237``
targets with every variable, uniform over the recipe's box and the window's four hours. Values are standard normal.

Forward: ``model.eval()`` under ``torch.no_grad()``. Training step: ``model.train()``, the negative mean
log-likelihood, backward, gradient clipping at the recipe's value and one AdamW step. Each is called ``--warmup``
times, then ``--repeats`` times; the median wall time is reported with the process CPU time of the same calls (on a
shared machine the CPU time is the steadier figure; on CUDA the calls are synchronised and the CPU time is the
host's). Results: a Markdown table and a CSV (``harness.Report``).

``--plan`` measures nothing: it turns the paper's training steps and forward-pass times
(``paper_training_budget.yaml``) and the recorded results into GPU-hours per row and table (``paper_gpu_hours``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import paper_gpu_hours
import torch
import yaml

import gridtnp.data  # noqa: F401  (registers the tasks)
from gridtnp.batch import Observations
from gridtnp.models import build_model, count_parameters
from gridtnp.models.neural_process import NeuralProcess
from gridtnp.registry import build_from_spec

PAPER = harness.ROOT / "recipes" / "paper"
TRAINING_KEYS = ("lr", "weight_decay", "warmup_steps", "lr_schedule", "cos_latitude_weighting", "latitude_dim")
NUM_STATIONS = 9957
WIND_POINTS = 4 * 97 * 237  # four hours of the 0.25 degree box [25, 49] x [-125, -66]


def sphere(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``[B, N, 2]`` (lat, lon) in degrees, uniform on the sphere."""
    lat = torch.rad2deg(torch.asin(2 * torch.rand(b, n, generator=g) - 1))
    return torch.stack([lat, 360 * torch.rand(b, n, generator=g) - 180], -1)


def observations(x: torch.Tensor, dim_y: int, g: torch.Generator, valid: bool = True) -> Observations:
    b, n = x.shape[:2]
    mask = torch.full((b, n), valid, dtype=torch.bool)
    return Observations(x, torch.randn(b, n, dim_y, generator=g), mask)


def workload(config: dict[str, Any], g: torch.Generator) -> tuple[dict[str, Observations], Observations]:
    """Context and targets shaped like the recipe's task at its batch size."""
    data, model = config["data"], config["model"]["init_args"]
    init, kind = data["init_args"], data["class_path"].rsplit(".", 1)[-1]
    b = int(init.get("loader", {}).get("batch_size", 8))
    if kind == "SyntheticDataModule":
        batch = build_from_spec("task", init["task"]).sample(b, g)
        return batch.context, batch.target
    init = {**init.get("task", {}), "region": init.get("store", {}).get("region")}
    share = sum(init.get("context_fraction", (0.0, 0.3))) / 2
    if kind == "StationReanalysisDataModule":
        context = {}
        if "grid" in model["dim_y"]:
            lat, lon = torch.meshgrid(torch.arange(-89.5, 90), torch.arange(-179.5, 180), indexing="ij")
            grid_x = torch.stack([lat, lon], -1).reshape(1, -1, 2).expand(b, -1, -1)
            context["grid"] = observations(grid_x.contiguous(), 1, g)
        n_c = round(share * NUM_STATIONS)
        context["stations"] = observations(sphere(b, max(n_c, 1), g), 1, g, valid=n_c > 0)
        return context, observations(sphere(b, NUM_STATIONS, g), 1, g)
    if kind == "MultiSourceDataModule":
        lat0, lat1, lon0, lon1 = init["region"]
        low, high = torch.tensor([0.0, lat0, lon0]), torch.tensor([4.0, lat1, lon1])

        def points(n: int) -> torch.Tensor:
            x = low + (high - low) * torch.rand(b, n, 3, generator=g)
            return torch.cat([x[..., :1].floor(), x[..., 1:]], -1)

        n_c = round(share * WIND_POINTS)
        context = {s: observations(points(n_c), 1, g) for s in model["dim_y"]}
        return context, observations(points(round(init["target_fraction"] * WIND_POINTS)), model["target_dim_y"], g)
    raise ValueError(f"no workload for {kind}")


def timed(fn: Callable[[], None], warmup: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """Median wall milliseconds and median process CPU milliseconds per call (synchronised on CUDA)."""
    wall, cpu = [], []
    for i in range(warmup + repeats):
        harness.synchronize(device)
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        harness.synchronize(device)
        if i >= warmup:
            wall.append(1e3 * (time.perf_counter() - w0))
            cpu.append(1e3 * (time.process_time() - c0))
    return statistics.median(wall), statistics.median(cpu)


def measure(path: Path, warmup: int, repeats: int, device: torch.device) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in TRAINING_KEYS}
    torch.manual_seed(0)
    model: NeuralProcess = build_model(spec).to(device)
    context, target = workload(config, torch.Generator().manual_seed(0))
    context, target = {k: v.to(device) for k, v in context.items()}, target.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=float(config["model"]["init_args"].get("lr", 5e-4)))
    clip = config["trainer"].get("gradient_clip_val")

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(context, target.x)

    def step() -> None:
        model.train()
        optimiser.zero_grad()
        loss = -model(context, target.x).log_prob(target.y).sum(-1)[target.mask].mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimiser.step()

    fwd_ms, fwd_cpu = timed(forward, warmup, repeats, device)
    step_ms, step_cpu = timed(step, warmup, repeats, device)
    return {
        "recipe": path.name,
        "params": count_parameters(model),
        "batch": target.x.shape[0],
        "forward_ms": fwd_ms,
        "forward_cpu_ms": fwd_cpu,
        "steps_per_s": 1e3 / step_ms,
        "step_cpu_ms": step_cpu,
    }


MEASURED = ("forward_ms", "forward_cpu_ms", "steps_per_s", "step_cpu_ms")


def plan(write: bool, check: bool) -> int:
    """Print the GPU-hours section; ``write`` renders it into docs/reproduce.md, ``check`` compares it (1: stale)."""
    body = paper_gpu_hours.section()
    if not (write or check):
        print(body, end="")
        return 0
    doc = paper_gpu_hours.DOC
    if paper_gpu_hours.update(doc, body, write=write):
        return 0
    if write:
        print(f"rewrote the GPU-hours section of {doc.relative_to(paper_gpu_hours.ROOT)}")
        return 0
    print(f"stale GPU-hours section in {doc.relative_to(paper_gpu_hours.ROOT)}; run {paper_gpu_hours.COMMAND}")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefixes", nargs="*", help="recipe file names (without .yaml) or prefixes, e.g. table4")
    parser.add_argument("--plan", action="store_true", help="GPU-hours per table from recorded results; no timing")
    parser.add_argument("--write", action="store_true", help="--plan: render it into docs/reproduce.md")
    parser.add_argument("--check", action="store_true", help="--plan: exit 1 if docs/reproduce.md's section is stale")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each of forward and training step")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads; default: torch's choice")
    parser.add_argument("--out", type=Path, help="default: results/paper_recipes_cost_<cpu|cuda>.md")
    args = parser.parse_args(argv)
    if args.write or args.check or args.plan:
        if args.prefixes or (args.write and args.check):
            parser.error("--plan takes no recipes, and either --write or --check")
        return plan(args.write, args.check)
    if not args.prefixes:
        parser.error("name the recipes to measure (file names or prefixes, e.g. table4), or pass --plan")
    device = torch.device(args.device)
    out = args.out or harness.RESULTS / f"paper_recipes_cost_{device.type}.md"
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = sorted({p for prefix in args.prefixes for p in PAPER.glob(f"{prefix}*.yaml")})
    if not paths:
        parser.error(f"no recipe in {PAPER} starts with {args.prefixes}")
    meta = harness.metadata(argparse.Namespace(**vars(args), bf16=False, compile=False), device)
    meta.pop("memory", None)  # not measured here
    meta["timing"] = f"median of {args.repeats} calls after {args.warmup} warm-up calls; wall and process CPU time"
    if device.type == "cuda":
        meta["timing"] += ", torch.cuda.synchronize() around each"
    report = harness.Report("Cost of the paper recipes", meta)

    def cell(key: str, digits: int = 1) -> Callable[[dict[str, Any]], str]:
        return lambda r: (
            f"{r[key]:,}"
            if isinstance(r[key], int)
            else (f"{r[key]:,.{digits}f}" if isinstance(r[key], float) and math.isfinite(r[key]) else str(r[key]))
        )

    columns = {
        "recipe": cell("recipe"),
        "params": cell("params"),
        "B": cell("batch"),
        "forward ms (wall)": cell("forward_ms"),
        "forward ms (CPU)": cell("forward_cpu_ms"),
        "steps/s (wall)": cell("steps_per_s", 3),
        "step ms (CPU)": cell("step_cpu_ms"),
    }
    for path in paths:  # the table is rewritten after every recipe, so a stopped run keeps what it measured
        try:
            row = measure(path, args.warmup, args.repeats, device)
        except (MemoryError, RuntimeError) as err:  # under a memory limit (ulimit -v), the row says so
            if not (isinstance(err, MemoryError) or harness.is_out_of_memory(err)):
                raise
            row = {"recipe": path.name, "params": "", "batch": "", **dict.fromkeys(MEASURED, "out of memory")}
        print(row, flush=True)
        report.add(row)
        for path_written in report.write(out, columns):
            print(f"wrote {path_written}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
