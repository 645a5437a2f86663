"""Peak memory of predicting many targets: the context is encoded once and targets are decoded in chunks.

    python benchmarks/predict_memory.py                      # recipes/era5_swin.yaml, 10^5 and 10^6 targets
    python benchmarks/predict_memory.py --targets 100000 1000000 --plain 100000

Each row runs in its own process (peak RSS is a per-process high-water mark): the recipe's model with random
weights, one task with ``--context`` random points per source over the recipe's grid, and ``--targets`` random
target locations, predicted with ``NeuralProcess.forward_chunked`` (``gridtnp.models.neural_process.TARGET_CHUNK``
targets at a time, as ``gridtnp predict`` and ``gridtnp.inference.predict`` do) or, for ``--plain`` sizes, with
one ``forward`` over every target. Bounded memory shows as the same peak for every chunked size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import run_record, write_table

from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.models.neural_process import TARGET_CHUNK
from gridtnp.models.specs import MODEL_KEYS

ROOT = Path(__file__).resolve().parents[1]


def child(recipe: Path, targets: int, context: int, chunked: bool) -> dict[str, float]:
    """One prediction in this process: its wall time and the process's peak RSS."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    spec = yaml.safe_load(recipe.read_text())["model"]["init_args"]
    model = build_model({k: v for k, v in spec.items() if k in MODEL_KEYS}).eval()
    grid = model.grid
    lower, upper = torch.tensor(grid.lower), torch.tensor(grid.upper)

    def points(n: int) -> torch.Tensor:
        return (lower + (upper - lower) * torch.rand(1, n, len(grid.lower))).float()

    encoders = model.encoders.items()
    ctx = {name: Observations(points(context), torch.randn(1, context, enc.dim_y)) for name, enc in encoders}
    xt = points(targets)
    start = time.perf_counter()
    with torch.no_grad():
        dist = model.forward_chunked(ctx, xt, TARGET_CHUNK) if chunked else model(ctx, xt)
    assert dist.mean.shape[1] == targets
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": time.perf_counter() - start, "peak_mb": peak_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "era5_swin.yaml")
    parser.add_argument("--targets", type=int, nargs="+", default=[100_000, 1_000_000], help="chunked sizes")
    parser.add_argument("--plain", type=int, nargs="*", default=[100_000], help="sizes predicted in one forward")
    parser.add_argument("--context", type=int, default=500, help="context points per source")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "predict_memory_cpu.md")
    parser.add_argument("--child", nargs=3, metavar=("TARGETS", "CONTEXT", "CHUNKED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.recipe, int(args.child[0]), int(args.child[1]), args.child[2] == "1")))
        return
    rows = []
    for targets, chunked in [*((n, True) for n in args.targets), *((n, False) for n in args.plain)]:
        cmd = [sys.executable, __file__, "--recipe", str(args.recipe), "--child", str(targets), str(args.context)]
        done = subprocess.run([*cmd, "1" if chunked else "0"], capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "targets": targets,
                "decoding": f"chunks of {TARGET_CHUNK:,}" if chunked else "all at once",
                "seconds": f"{result['seconds']:.1f}",
                "peak RSS (MB)": f"{result['peak_mb']:.0f}",
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **run_record(torch.device("cpu")),
        "model": f"{args.recipe.relative_to(ROOT)} with random weights, one task, {args.context} context points "
        "per source, one torch thread",
        "peak RSS": "ru_maxrss of the process that predicted (model, inputs and outputs included)",
    }
    for path in write_table(args.out, "Predicting many targets: peak memory", meta, rows):
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
