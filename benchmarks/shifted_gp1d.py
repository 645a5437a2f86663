"""Shifted 1-D GP test sets: does a model keep its log-likelihood when all inputs move by Delta?

    nice -n 10 python benchmarks/shifted_gp1d.py recipes/gp1d_te_tnp.yaml recipes/gp1d_tnp.yaml \
        --steps 500 --dim 64 --layers 3 --out benchmarks/results/shifted_gp1d_cpu.md

Each recipe's model is trained the same way: the recipe's ``gp1d`` task (x_c ~ U[-2, 2], x_t ~ U[-3, 3]), batch
size, learning rate and seed, AdamW with gradient clipping 0.5, ``--steps`` steps, optionally resized to a common
``--dim`` and number of processor ``--layers``. Then the final weights are evaluated on fixed test sets of the same
task with both ranges moved by each ``--shifts`` Delta (``gp1d`` ``shift``), and on the bimodal input test
(x_c, x_t ~ U[-4, -1] or U[1, 4]) with ``--bimodal``. The same seeds draw every test set, so a Delta test set is the
Delta = 0 one moved by Delta (the GP is stationary): a translation-equivariant model scores the same on both up
to float rounding. Reported: mean log-likelihood per target and the exact GP oracle on the same tasks.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import command_line, device_name, git_commit, write_table

from gridtnp.data.datamodules import FixedTaskSet, SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.module import NeuralProcessModule
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.registry import build_from_spec

BIMODAL = [[-4.0, -1.0], [1.0, 4.0]]


def model_args(config: dict[str, Any], dim: int | None, layers: int | None) -> dict[str, Any]:
    """The recipe's model arguments with ``dim`` and the processor's ``layers`` overridden."""
    init = copy.deepcopy(config["model"]["init_args"])
    if dim is not None:
        init["dim"] = dim
    if layers is not None:
        init["processor"] = {**init["processor"], "layers": layers}
    return init


@torch.no_grad()
def evaluate(module: NeuralProcessModule, task_spec: dict[str, Any], batch_size: int, batches: int) -> dict[str, float]:
    """Mean log-likelihood per target and the oracle's over a fixed test set of ``batches`` batches."""
    module.eval()
    task = build_from_spec("task", task_spec)
    loglik, oracle = [], []
    for batch in FixedTaskSet(task, batch_size, batches, seed=0, split="test"):
        loglik.append(log_likelihood(module(batch), batch.target.y, batch.target.valid()))
        oracle.append(batch.extras["oracle_loglik"])
    return {"loglik": float(torch.cat(loglik).mean()), "oracle": float(torch.cat(oracle).mean())}


def train_and_test(recipe: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    config = yaml.safe_load(recipe.read_text())
    seed = config.get("seed_everything", 0)
    L.seed_everything(seed, verbose=False)
    data_args = config["data"]["init_args"]
    task = data_args["task"]
    if not isinstance(task, dict) or task.get("name") != "gp1d":
        raise SystemExit(f"{recipe}: this benchmark needs a recipe on the gp1d task; it has {task!r}.")
    batch_size = data_args.get("batch_size", 16)
    data = from_flat_arguments(
        SyntheticDataModule, task=task, batch_size=batch_size, train_batches=args.steps, val_batches=1, seed=seed
    )
    module = NeuralProcessModule(**model_args(config, args.dim, args.layers), compile=args.compile)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=args.steps,
        limit_val_batches=0,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    tests = [(f"Delta = {s:g}", {**task, "shift": s}) for s in args.shifts]
    if args.bimodal:
        tests.append(("bimodal", {**task, "context_range": BIMODAL, "target_range": BIMODAL}))
    rows = []
    for label, spec in tests:
        metrics = evaluate(module, spec, batch_size, args.test_batches)
        rows.append(
            {
                "model": recipe.stem,
                "parameters": module.num_parameters,
                "steps": trainer.global_step,
                "train_seconds": round(seconds, 1),
                "test set": label,
                "loglik": round(metrics["loglik"], 3),
                "oracle_loglik": round(metrics["oracle"], 3),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="+", type=Path, help="recipes on the gp1d task")
    parser.add_argument("--steps", type=int, default=500, help="training steps per model")
    parser.add_argument("--dim", type=int, default=None, help="override every model's token width")
    parser.add_argument("--layers", type=int, default=None, help="override every model's processor layers")
    parser.add_argument("--shifts", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="test-set shifts Delta")
    parser.add_argument("--bimodal", action="store_true", help="also test on x ~ U[-4, -1] or U[1, 4]")
    parser.add_argument("--compile", action="store_true", help="torch.compile the models (NeuralProcessModule compile)")
    parser.add_argument("--test-batches", type=int, default=32, help="batches per test set")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/shifted_gp1d_cpu.md"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started_at = git_commit()
    load = os.getloadavg()[0]
    rows = [row for recipe in args.recipes for row in train_and_test(recipe, args)]
    meta = {
        "command": f"`{command_line()}`",
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "commit": started_at,
        "load": f"{load:.2f} at the start (train_seconds are rough when it exceeds the number of cores)",
        "test sets": f"{args.test_batches} batches of the recipe's batch size, seeds fixed, the same for every model",
    }
    for path in write_table(args.out, "Shifted 1-D GP test sets", meta, rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
