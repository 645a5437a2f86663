"""Time and peak memory against the context size N_c (fixed grid) and against the grid size (fixed N_c), as a plot.

    python benchmarks/scaling.py                       # a GPU: N_c up to 1e5, grids up to 128 x 128, batch 8
    python benchmarks/scaling.py --small --threads 1   # a CPU in minutes
    python benchmarks/scaling.py --backward --bf16 --compile

Models on 2-D GP-shaped inputs (``x`` uniform in [-6, 6]^2, ``y`` standard normal, N_t = 1,000): Swin-TNP with the
pseudo-token grid encoder (``swin_tnp`` preset), ConvCNP (``convcnp``: dense SetConv and U-Net), and, for the N_c
sweep only, the grid-free PT-TNP (perceiver, 128 pseudo-tokens) and TNP (full attention over the context).
Sweep 1: N_c at a 32 x 32 grid. Sweep 2: grids of M x M points at a fixed N_c. Timing and memory as in
``forward_time.py`` (same ``harness``); slow or out-of-memory configurations stop that model's sweep.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

import forward_time
import harness
import torch

from gridtnp import count_parameters, create_model

BOX = ([-6.0, -6.0], [6.0, 6.0])
CONTEXT_MODELS = {
    "Swin-TNP PT-GE": lambda m: create_model("swin_tnp", grid_size=m),
    "ConvCNP": lambda m: create_model("convcnp", dim_x=2, grid_size=m),
    "PT-TNP (perceiver, M = 128)": lambda m: create_model("pt_tnp_perceiver", dim_x=2),
    "TNP (full attention)": lambda m: create_model("tnp", dim_x=2),
}
GRID_MODELS = ("Swin-TNP PT-GE", "ConvCNP")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, help="default 8 (2 with --small)")
    parser.add_argument("--num-context", type=int, nargs="+", help="N_c sweep; default 1e3 3e3 1e4 3e4 1e5")
    parser.add_argument("--grid-sizes", type=int, nargs="+", help="M of the M x M grid sweep; default 16 32 64 128")
    parser.add_argument("--grid-context", type=int, help="N_c of the grid sweep; default 10000 (1000 with --small)")
    parser.add_argument("--num-targets", type=int, default=1_000)
    parser.add_argument("--backward", action="store_true", help="also time forward + backward of the log-likelihood")
    harness.add_common_arguments(parser, "scaling")
    args = parser.parse_args(argv)
    small = {
        "batch_size": 2,
        "num_context": [300, 1_000, 3_000, 10_000],
        "grid_sizes": [16, 32, 64],
        "grid_context": 1_000,
    }
    full = {
        "batch_size": 8,
        "num_context": [1_000, 3_000, 10_000, 30_000, 100_000],
        "grid_sizes": [16, 32, 64, 128],
        "grid_context": 10_000,
    }
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.batch_size, args.num_targets, args.grid_context, *args.num_context, *args.grid_sizes) < 1:
        parser.error("sizes must be >= 1")
    harness.finish_common_arguments(parser, args, "scaling", repeats=(2, 5))
    return args


def plot(path: Path, rows: list[dict[str, Any]], meta: dict[str, str]) -> Path:
    """Four log-log panels: time and peak memory against N_c and against the number of grid points."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8), layout="constrained")
    panels = [
        ("N_c", "num_context", "median_ms", "median ms per call"),
        ("N_c", "num_context", "peak_mib", "peak MiB"),
        ("grid", "grid_points", "median_ms", "median ms per call"),
        ("grid", "grid_points", "peak_mib", "peak MiB"),
    ]
    for i, (sweep, x_key, y_key, y_label) in enumerate(panels, start=1):
        ax = fig.add_subplot(2, 2, i)
        lines: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            if r["sweep"] == sweep and r[y_key] is not None and r[y_key] > 0:
                lines.setdefault(f"{r['model']} ({r['passes']})", []).append((r[x_key], r[y_key]))
        for label, points in lines.items():
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, "o-", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context points N_c (32 x 32 grid)" if sweep == "N_c" else "grid points M x M (fixed N_c)")
        ax.set_ylabel(y_label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{meta['device']}, {meta['precision']}, {meta['compile']}", fontsize=10)
    path = path.with_suffix(".png")
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    meta = harness.metadata(
        args,
        device,
        inputs=f"x ~ U[-6, 6]^2, y ~ N(0, 1), N_t = {args.num_targets:,}, batch {args.batch_size}",
        forward="torch.no_grad(), model.eval(); forward+backward: model.train(), -log_prob(y_t).mean().backward()",
    )
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    rows: list[dict[str, Any]] = []
    for label, build in CONTEXT_MODELS.items():
        model = build(32)
        works = [forward_time.Workload({"points": n}, args.num_targets, BOX) for n in args.num_context]
        grid_points = model.grid.num_points if model.grid is not None else None
        for row in forward_time.benchmark_model(label, model, works, args, device):
            rows.append({"sweep": "N_c", **asdict(row), "grid_points": grid_points})
        del model
    for label in GRID_MODELS:
        history: list[tuple[float, float]] = []
        for m in args.grid_sizes:
            model = CONTEXT_MODELS[label](m)
            print(f"{label} at {m} x {m}: {count_parameters(model):,} parameters", flush=True)
            work = forward_time.Workload({"points": args.grid_context}, args.num_targets, BOX)
            predicted = harness.predict_ms(history, m * m)
            if predicted > 1e3 * args.max_call_seconds:
                note = f"skipped: predicted {predicted / 1e3:,.0f} s per call > --max-call-seconds"
                row = forward_time.Row(
                    label,
                    count_parameters(model),
                    args.batch_size,
                    args.grid_context,
                    args.num_targets,
                    "forward",
                    None,
                    None,
                    None,
                    0,
                    note,
                )
                result = [row]
            else:
                result = forward_time.benchmark_model(label, model, [work], args, device)
            forward = next(r for r in result if r.passes == "forward")
            if forward.median_ms is not None:
                history.append((m * m, forward.median_ms))
            for row in result:
                rows.append({"sweep": "grid", **asdict(row), "grid_points": m * m})
            del model
    report = harness.Report("Scaling: time and peak memory against N_c and grid size", meta)
    for row in rows:
        report.add(row)
    cols = {
        "sweep": lambda r: r["sweep"],
        "model": lambda r: r["model"],
        "params": lambda r: f"{r['params']:,}",
        "B": lambda r: str(r["batch_size"]),
        "N_c": lambda r: f"{r['num_context']:,}",
        "grid points": lambda r: "-" if r["grid_points"] is None else f"{r['grid_points']:,}",
        "pass": lambda r: r["passes"],
        "median ms": lambda r: harness.fmt(r["median_ms"]),
        "peak MiB": lambda r: harness.fmt(r["peak_mib"]),
        "note": lambda r: r["note"],
    }
    written = report.write(args.out, cols)
    written.append(plot(args.out, rows, meta))
    print("\n" + report.markdown(cols) + "\nwritten: " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
