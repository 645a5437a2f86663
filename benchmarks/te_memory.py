"""Peak memory of a TE-TNP's translation-equivariant attention: naive (unchunked) vs chunked over queries.

    nice -n 10 python benchmarks/te_memory.py --out benchmarks/results/te_memory_cpu.md
    python benchmarks/te_memory.py --device cuda --out benchmarks/results/te_memory_cuda.md

The model is the ``te_tnp`` preset in 2-D with D_z = 128 and 5 layers (5 TE-MHSA blocks on the context, 5 TE-MHCA
blocks into the targets; post variant, rho with 32 hidden units; 1.05 M parameters), random inputs in [-2, 2]^2,
batch ``--batch-size``. For every N_c x N_t and pass (``forward``: eval mode under ``torch.no_grad()``;
``forward+backward``: ``-log p(y_t)`` and ``.backward()``), one configuration runs in its own subprocess: build the
model and inputs, one warm-up call on a tiny input (lazy initialisation), then one measured call.

* naive: ``max_pairs=None``, every layer materialises ``[B, N_q, N_k, 32]`` rho activations (and keeps them for
  the backward pass); skipped where ``--naive-limit-gb`` says it would not fit (estimate: 0.5 KB per pair and
  layer for forward+backward, 0.4 KB per pair of one layer for forward);
* chunked: the default ``max_pairs`` (65,536 (batch, query, key) triples per chunk, each under
  ``torch.utils.checkpoint`` when gradients are needed).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated()`` above what was allocated before the call; on the CPU the
process's peak resident set size (``VmHWM``, reset before the call) above the resident set size before it, using
``PeakMemory`` of ``benchmarks/forward_time.py`` (``tracemalloc`` does not see torch's allocator). The table also
gives the whole process's peak RSS (Python, torch libraries, model and inputs included).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import PeakMemory, command_line, device_name, git_commit

from gridtnp import Observations, count_parameters, create_model
from gridtnp.nn.chunking import DEFAULT_MAX_PAIRS

ROOT = Path(__file__).resolve().parent.parent
NAIVE_BYTES_PER_PAIR = {"forward": 400, "forward+backward": 512}


def build(version: str, dim: int, layers: int) -> torch.nn.Module:
    max_pairs = None if version == "naive" else DEFAULT_MAX_PAIRS
    return create_model(
        "te_tnp",
        dim_x=2,
        dim=dim,
        layers=layers,
        processor={"max_pairs": max_pairs},
        grid_decoder={"max_pairs": max_pairs},
    )


def call(model: torch.nn.Module, passes: str, b: int, nc: int, nt: int, device: torch.device) -> None:
    g = torch.Generator().manual_seed(nc * 7919 + nt)
    ctx = Observations(4 * torch.rand(b, nc, 2, generator=g) - 2, torch.randn(b, nc, 1, generator=g))
    ctx = ctx.to(device)
    xt = (4 * torch.rand(b, nt, 2, generator=g) - 2).to(device)
    yt = torch.randn(b, nt, 1, generator=g).to(device)
    if passes == "forward":
        model.eval()
        with torch.no_grad():
            model({"points": ctx}, xt)
        return
    model.train()
    model.zero_grad(set_to_none=True)
    (-model({"points": ctx}, xt).log_prob(yt).mean()).backward()


def rss_mib(field: str) -> float | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return float(match.group(1)) / 1024 if match else None


def measure_one(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process and return its row."""
    device = torch.device(cfg["device"])
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = build(cfg["version"], cfg["dim"], cfg["layers"]).to(device)
    call(model, cfg["passes"], 1, 4, 4, device)  # warm-up: lazy initialisation, thread pools
    memory = PeakMemory(device)
    memory.start()
    start = time.perf_counter()
    try:
        call(model, cfg["passes"], cfg["batch_size"], cfg["num_context"], cfg["num_targets"], device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        peak, note = memory.peak(), ""
    except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
        if "out of memory" not in str(err) and "can't allocate memory" not in str(err):
            raise
        peak, note = None, "out of memory"
    seconds = time.perf_counter() - start
    return {
        **{k: cfg[k] for k in ("version", "passes", "num_context", "num_targets", "batch_size")},
        "parameters": count_parameters(model),
        "peak_mib": None if peak is None else round(peak, 1),
        "process_peak_rss_mib": None if device.type == "cuda" else rss_mib("VmHWM"),
        "seconds": round(seconds, 1),
        "note": note,
        "method": memory.method,
    }


def naive_estimate_gb(cfg: dict[str, Any]) -> float:
    """Rough bytes the naive version needs: pairs of every layer (training) or of the largest layer (inference)."""
    b, nc, nt, layers = cfg["batch_size"], cfg["num_context"], cfg["num_targets"], cfg["layers"]
    pairs = b * max(nc * nc, nt * nc) if cfg["passes"] == "forward" else b * layers * (nc * nc + nt * nc)
    return pairs * NAIVE_BYTES_PER_PAIR[cfg["passes"]] / 1e9


def run_in_subprocess(cfg: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--single", json.dumps(cfg)], capture_output=True, text=True, cwd=ROOT
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        killed = out.returncode in (-9, 137)
        note = "killed (out of memory)" if killed else f"failed: {out.stderr.strip().splitlines()[-1:]}"
        return {**cfg, "peak_mib": None, "process_peak_rss_mib": None, "seconds": None, "note": note}
    return json.loads(lines[-1])


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-context", type=int, nargs="+", default=[10, 100, 1000, 5000])
    parser.add_argument("--num-targets", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--passes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--versions", nargs="+", default=["naive", "chunked"])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--naive-limit-gb", type=float, default=6.0, help="skip naive runs estimated above this")
    parser.add_argument("--out", type=Path, default=None, help="Markdown table (a CSV with the same stem)")
    parser.add_argument("--single", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(measure_one(json.loads(args.single))), flush=True)
        return

    out = args.out or ROOT / "benchmarks" / "results" / f"te_memory_{torch.device(args.device).type}.md"
    commit, load = git_commit(), os.getloadavg()[0]
    rows = []
    for passes in args.passes:
        for nt in args.num_targets:
            for nc in args.num_context:
                for version in args.versions:
                    cfg = {
                        "version": version,
                        "passes": passes,
                        "num_context": nc,
                        "num_targets": nt,
                        "batch_size": args.batch_size,
                        "dim": args.dim,
                        "layers": args.layers,
                        "device": args.device,
                        "threads": args.threads,
                    }
                    if version == "naive" and naive_estimate_gb(cfg) > args.naive_limit_gb:
                        row = {**cfg, "peak_mib": None, "process_peak_rss_mib": None, "seconds": None}
                        row["note"] = f"not run: estimated {naive_estimate_gb(cfg):.0f} GB > {args.naive_limit_gb:g}"
                    else:
                        row = run_in_subprocess(cfg)
                    print(json.dumps(row), flush=True)
                    rows.append(row)

    method = next((r["method"] for r in rows if r.get("method")), "")
    device = device_name(torch.device(args.device))
    keys = ["version", "passes", "num_context", "num_targets", "peak_mib", "process_peak_rss_mib", "seconds", "note"]
    header = [
        "# TE attention memory: naive vs chunked (TE-TNP, 2-D, D_z = 128, 5 layers)",
        "",
        f"- command: `{command_line()}`",
        f"- device: {device}; torch {torch.__version__}; "
        f"batch size {args.batch_size}; commit {commit}; load average at the start {load:.2f}",
        f"- chunked: max_pairs = {DEFAULT_MAX_PAIRS} (batch, query, key) triples per chunk, checkpointed per chunk",
        f"- peak_mib: {method}",
        "- process_peak_rss_mib: the whole process (Python, torch, model, inputs); seconds: the measured call (rough"
        " where other jobs share the machine: see the load average)",
        "",
        "| " + " | ".join(keys) + " |",
        "|" + " --- |" * len(keys),
    ]
    table = ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header + table) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print("\n".join(header + table))


if __name__ == "__main__":
    main()
