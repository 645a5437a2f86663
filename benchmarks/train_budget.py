"""Train several recipes for the same wall-clock budget and compare them on the same fixed test set.

    python benchmarks/train_budget.py recipes/gp2d_swin_pt.yaml recipes/gp2d_convcnp.yaml recipes/gp2d_pt_tnp.yaml \
        --minutes 10 --out benchmarks/results/gp2d_budget_cpu.md

Each recipe is trained from its own seed with the recipe's data module, optimiser and batch size, for
``--minutes`` of wall-clock time (Lightning's ``max_time``), without validation during training; then the
final weights are evaluated on the recipe's fixed test set (``test/loglik``, ``test/rmse``). Writes a Markdown
table and a CSV with the command, device, torch version and commit. Run it on an otherwise idle machine: the
budget is wall-clock time.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import importlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

from gridtnp.module import NeuralProcessModule


def instantiate(config: dict[str, Any]) -> Any:
    """An object from a ``{class_path, init_args}`` mapping."""
    module, _, name = config["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**config.get("init_args", {}))


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def train_one(recipe: Path, minutes: float, threads: int | None, test_batches: int | None) -> dict[str, Any]:
    """Train ``recipe`` for ``minutes`` and return its test metrics, steps and seconds."""
    config = yaml.safe_load(recipe.read_text())
    L.seed_everything(config.get("seed_everything", 0), verbose=False)
    if threads:
        torch.set_num_threads(threads)
    data_cfg = config["data"]
    if test_batches is not None:
        data_cfg = {**data_cfg, "init_args": {**data_cfg["init_args"], "test_batches": test_batches}}
    data = instantiate(data_cfg)
    model = NeuralProcessModule(**config["model"]["init_args"])
    trainer = L.Trainer(
        accelerator="auto",
        max_time=dt.timedelta(minutes=minutes),
        max_steps=-1,
        max_epochs=-1,
        limit_val_batches=0,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(model, data)
    seconds = time.perf_counter() - start
    (metrics,) = trainer.test(model, data, verbose=False)
    return {
        "recipe": recipe.stem,
        "parameters": model.num_parameters,
        "steps": trainer.global_step,
        "train_seconds": round(seconds, 1),
        "batch_size": data_cfg["init_args"].get("batch_size"),
        "test_loglik": round(metrics["test/loglik"], 4),
        "test_rmse": round(metrics["test/rmse"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="+", type=Path)
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock training budget per recipe")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--test-batches", type=int, default=None, help="override the recipe's test set size")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/train_budget.md"))
    args = parser.parse_args()
    started_at = commit()  # the code that runs, even if the tree changes while it trains

    rows = []
    for recipe in args.recipes:
        row = train_one(recipe, args.minutes, args.threads, args.test_batches)
        print(row, flush=True)
        rows.append(row)

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.processor() or 'cpu'})"
    header = [
        f"# Training budget: {args.minutes:g} minutes per recipe",
        "",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}; device: {device}; threads: "
        f"{torch.get_num_threads()}; torch {torch.__version__}; precision 32-true; commit {started_at}",
        f"- load average at the end: {os.getloadavg()[0]:.2f}",
        "",
    ]
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    table += ["| " + " | ".join(f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys) + " |" for r in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(header + table) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    print("\n".join(table))


if __name__ == "__main__":
    main()
