"""Training iterations per second of gridded TNPs on white noise shaped like the ERA5 station task.

    python benchmarks/iterations_per_second.py                      # the full experiment (a GPU)
    python benchmarks/iterations_per_second.py --small --threads 1  # smoke run on a CPU, a few minutes
    python benchmarks/iterations_per_second.py --batch-size 4 --bf16 --compile

The {On, Off}-the-grid experiment of the gridded TNP thesis (its Table 4.2): how fast can a model train when
the on-the-grid input is a global 120 x 240 field (1.5 degree) plus off-the-grid points, as a function of the
resolution the pseudo-token grid encoder coarsens onto (20 x 40, 30 x 60, 60 x 120, 120 x 240) and of the
processor: full attention over all pseudo-tokens (TNP) or Swin attention in 5 x 5 or 10 x 10 windows. Every model
decodes targets from their 9 nearest pseudo-tokens after each layer.

Inputs (white noise, drawn once and kept on the device, so the data pipeline is not measured):
``context["grid"]``: the 28,800 cell centres of the 120 x 240 grid, ``y ~ N(0, 1)``; ``context["stations"]``:
``--num-off-grid`` points uniform on the sphere; targets: ``--num-targets`` more such points. Defaults are the
largest task of the ERA5 station recipes (a 0.3 share of the 9,957 HadISD stations as context, the rest as
targets). Models: ``dim`` 128, 5 layers, 8 heads, pseudo-token grid encoder (``coarsen`` = 120 / resolution),
spherical-harmonic embedding of (lat, lon), longitude rolled. One iteration: forward, ``-log_prob(y_t).mean()``,
backward, gradient clipping at 0.5 and an AdamW step.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import harness
import torch

from gridtnp import count_parameters
from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.models.neural_process import NeuralProcess
from gridtnp.nn.grids import Grid

INPUT_SHAPE = (120, 240)
RESOLUTIONS = [(20, 40), (30, 60), (60, 120), (120, 240)]
MODELS = {"TNP (full attention)": None, "Swin 5 x 5": 5, "Swin 10 x 10": 10}


def input_grid(shape: tuple[int, int] = INPUT_SHAPE) -> Grid:
    """Global grid of cell centres: latitudes from -90 + h/2 to 90 - h/2, longitudes from -180, rolled."""
    step = 180.0 / shape[0]
    return Grid([-90.0 + step / 2, -180.0], [90.0 - step / 2, 180.0], shape, roll=[False, True])


def model_spec(window: int | None, resolution: tuple[int, int], dim: int = 128, layers: int = 5) -> dict[str, Any]:
    """The model of one table cell: ``window`` None is full attention, else Swin with that square window."""
    grid = input_grid()
    coarsen = [m // r for m, r in zip(INPUT_SHAPE, resolution, strict=True)]
    processor = (
        {"name": "transformer", "layers": layers}
        if window is None
        else {"name": "swin", "layers": layers, "window": window, "shift": window // 2}
    )
    return {
        "dim_x": 2,
        "dim_y": {"grid": 1, "stations": 1},
        "target_source": "stations",
        "dim": dim,
        "grid": {"lower": list(grid.lower), "upper": list(grid.upper), "shape": list(grid.shape), "roll": [0, 1]},
        "encoder": {"name": "mlp", "embed": {"name": "spherical_harmonics", "legendre_polynomials": 10}},
        "grid_encoder": {"name": "pseudo_token", "coarsen": None if coarsen == [1, 1] else coarsen},
        "processor": processor,
        "grid_decoder": {"name": "knn", "k": 9},
        "likelihood": {"name": "gaussian"},
    }


def sphere_points(b: int, n: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """``[b, n, 2]`` (lat, lon) in degrees, uniform on the sphere."""
    u = torch.rand(b, n, 2, generator=g)
    lat = torch.rad2deg(torch.asin(2 * u[..., 0] - 1))
    return torch.stack([lat, 360 * u[..., 1] - 180], -1).to(device)


def white_noise_task(
    b: int, num_off_grid: int, num_targets: int, device: torch.device
) -> tuple[dict[str, Observations], torch.Tensor, torch.Tensor]:
    """Context (the 120 x 240 grid and off-the-grid points), target locations and target values."""
    g = torch.Generator().manual_seed(0)
    grid_x = input_grid().points().reshape(-1, 2).expand(b, -1, -1).contiguous().to(device)
    context = {
        "grid": Observations(grid_x, torch.randn(b, grid_x.shape[1], 1, generator=g).to(device)),
        "stations": Observations(
            sphere_points(b, num_off_grid, device, g), torch.randn(b, num_off_grid, 1, generator=g).to(device)
        ),
    }
    return context, sphere_points(b, num_targets, device, g), torch.randn(b, num_targets, 1, generator=g).to(device)


def training_step(
    model: NeuralProcess, runner: torch.nn.Module, task: tuple, device: torch.device, bf16: bool
) -> callable:
    """One optimiser step on ``task`` as a closure."""
    context, xt, yt = task
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with harness.autocast(device, bf16):
            dist = runner(context, xt)
        loss = -dist.log_prob(yt).mean()  # the likelihood computes densities in float32
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()

    return step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, help="tasks per iteration; default 16 (1 with --small)")
    parser.add_argument("--num-off-grid", type=int, help="off-the-grid context points; default 2987 (300 --small)")
    parser.add_argument("--num-targets", type=int, help="target points; default 6970 (700 with --small)")
    parser.add_argument(
        "--resolutions",
        nargs="+",
        help="coarse grids as HxW; default 20x40 30x60 60x120 120x240 (without 120x240 with --small)",
    )
    parser.add_argument("--models", nargs="+", choices=["tnp", "swin5", "swin10"], help="default: all three")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=5)
    harness.add_common_arguments(parser, "iterations_per_second")
    args = parser.parse_args(argv)
    small = {"batch_size": 1, "num_off_grid": 300, "num_targets": 700, "resolutions": ["20x40", "30x60", "60x120"]}
    full = {
        "batch_size": 16,
        "num_off_grid": 2_987,
        "num_targets": 6_970,
        "resolutions": ["20x40", "30x60", "60x120", "120x240"],
    }
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.resolutions = [tuple(int(v) for v in r.lower().split("x")) for r in args.resolutions]
    except ValueError:
        parser.error(f"--resolutions: expected HxW values such as 30x60; got {args.resolutions}")
    for h, w in args.resolutions:
        if len(INPUT_SHAPE) != 2 or INPUT_SHAPE[0] % h or INPUT_SHAPE[1] % w:
            parser.error(f"--resolutions: {h}x{w} must divide the input grid {INPUT_SHAPE[0]}x{INPUT_SHAPE[1]}")
    if min(args.batch_size, args.num_off_grid, args.num_targets) < 1:
        parser.error("--batch-size, --num-off-grid and --num-targets must be >= 1")
    names = {"tnp": "TNP (full attention)", "swin5": "Swin 5 x 5", "swin10": "Swin 10 x 10"}
    args.models = [names[m] for m in args.models] if args.models else list(MODELS)
    harness.finish_common_arguments(parser, args, "iterations_per_second", repeats=(2, 10))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    meta = harness.metadata(
        args,
        device,
        task=f"white noise; context: {INPUT_SHAPE[0]} x {INPUT_SHAPE[1]} grid ({INPUT_SHAPE[0] * INPUT_SHAPE[1]:,} "
        f"points) + {args.num_off_grid:,} off-the-grid points; {args.num_targets:,} targets; batch {args.batch_size}",
        iteration="forward, -log_prob(y_t).mean(), backward, clip_grad_norm 0.5, AdamW step",
    )
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    report = harness.Report("Training iterations per second ({On, Off}-the-grid, white noise)", meta)
    task = white_noise_task(args.batch_size, args.num_off_grid, args.num_targets, device)
    for label in args.models:
        window = MODELS[label]
        history: list[tuple[float, float]] = []
        stopped = ""
        for resolution in args.resolutions:
            tokens = resolution[0] * resolution[1]
            row: dict[str, Any] = {
                "model": label,
                "resolution": f"{resolution[0]} x {resolution[1]}",
                "tokens": tokens,
                "params": None,
                "batch_size": args.batch_size,
                "median_ms": None,
                "iterations_per_s": None,
                "peak_mib": None,
                "note": "",
            }
            if window is not None and (resolution[0] % window or resolution[1] % window):
                row["note"] = f"window {window} does not divide the grid"
                report.add(row)
                continue
            # full attention grows quadratically in the tokens, Swin linearly
            predicted = harness.predict_ms(history, tokens, max_power=2.0 if window is None else 1.0)
            if not stopped and predicted > 1e3 * args.max_call_seconds:
                stopped = f"skipped: predicted {predicted / 1e3:,.0f} s per iteration > --max-call-seconds"
            if stopped:
                row["note"] = stopped
                report.add(row)
                print(row, flush=True)
                continue
            torch.manual_seed(0)
            model = build_model(model_spec(window, resolution, args.dim, args.layers)).to(device)
            row["params"] = count_parameters(model)
            step = training_step(model, harness.maybe_compile(model, args.compile), task, device, args.bf16)
            try:
                times, row["peak_mib"], row["note"] = harness.measure(
                    step, device, args.warmup, args.repeats, args.max_call_seconds
                )
                row["median_ms"] = statistics.median(times)
                row["iterations_per_s"] = 1e3 / row["median_ms"]
                history.append((tokens, row["median_ms"]))
                if row["note"]:
                    stopped = f"skipped: {row['resolution']} was already too slow"
            except Exception as err:
                if not harness.is_out_of_memory(err):
                    raise
                row["note"], stopped = "out of memory", f"skipped: out of memory at {row['resolution']}"
            del model, step
            harness.free(device)
            report.add(row)
            speed = f"{harness.fmt(row['median_ms'])} ms/it, {harness.fmt(row['iterations_per_s'], 2)} it/s"
            print(
                f"{label:>22} {row['resolution']:>10}: {speed}, peak {harness.fmt(row['peak_mib'])} MiB {row['note']}"
            )
    columns = {
        "model": lambda r: r["model"],
        "grid": lambda r: r["resolution"],
        "pseudo-tokens": lambda r: f"{r['tokens']:,}",
        "params": lambda r: "-" if r["params"] is None else f"{r['params']:,}",
        "B": lambda r: str(r["batch_size"]),
        "ms / iteration": lambda r: harness.fmt(r["median_ms"]),
        "iterations / s": lambda r: harness.fmt(r["iterations_per_s"], 2),
        "peak MiB": lambda r: harness.fmt(r["peak_mib"]),
        "note": lambda r: r["note"],
    }
    written = report.write(args.out, columns)
    series: dict[str, list[tuple[float, float]]] = {}
    memory: dict[str, list[tuple[float, float]]] = {}
    for r in report.rows:
        series.setdefault(r["model"], []).append((r["tokens"], r["iterations_per_s"]))
        memory.setdefault(r["model"], []).append((r["tokens"], r["peak_mib"]))
    written.append(
        harness.line_plot(
            args.out,
            series,
            "pseudo-tokens (coarse grid points)",
            "training iterations / s",
            f"{meta['device']}, {meta['precision']}, batch {args.batch_size}",
            panels={"peak memory (MiB)": memory},
        )
    )
    print(report.markdown(columns) + "\nwritten: " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
