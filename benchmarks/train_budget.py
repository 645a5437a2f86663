"""Train several recipes for the same wall-clock budget and compare them on the same fixed test set.

    python benchmarks/train_budget.py recipes/gp2d_paper_swin_pt.yaml recipes/gp2d_paper_convcnp.yaml \
        recipes/gp2d_paper_pt_tnp_ist.yaml --minutes 10 --out benchmarks/results/gp2d_paper_budget_cpu.md

Each recipe is trained from its own seed with the recipe's data module, optimiser and batch size, for
``--minutes`` of wall-clock time (Lightning's ``max_time``), without validation during training; then the
final weights are evaluated on the recipe's fixed test set (``test/loglik``, ``test/rmse``). Writes a Markdown
table and a CSV with the command, device, torch version and commit. Run it on an otherwise idle machine: the
budget is wall-clock time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
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

from gridtnp.module import NeuralProcessModule


def instantiate(config: dict[str, Any]) -> Any:
    """An object from a ``{class_path, init_args}`` mapping."""
    module, _, name = config["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**config.get("init_args", {}))


def train_one(
    recipe: Path, minutes: float, threads: int | None, test_batches: int | None, compile_model: bool = False
) -> dict[str, Any]:
    """Train ``recipe`` for ``minutes`` and return its test metrics, steps and seconds."""
    config = yaml.safe_load(recipe.read_text())
    L.seed_everything(config.get("seed_everything", 0), verbose=False)
    if threads:
        torch.set_num_threads(threads)
    data_cfg = config["data"]
    if test_batches is not None:
        data_cfg = {**data_cfg, "init_args": {**data_cfg["init_args"], "test_batches": test_batches}}
    data = instantiate(data_cfg)
    model = NeuralProcessModule(**{**config["model"]["init_args"], "compile": compile_model})
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
    parser.add_argument("--compile", action="store_true", help="torch.compile the models (NeuralProcessModule compile)")
    parser.add_argument("--test-batches", type=int, default=None, help="override the recipe's test set size")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/train_budget.md"))
    args = parser.parse_args()
    started_at = git_commit()  # the code that runs, even if the tree changes while it trains

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for recipe in args.recipes:
        row = train_one(recipe, args.minutes, args.threads, args.test_batches, args.compile)
        print(row, flush=True)
        rows.append(row)
        # Written after every recipe, so a long comparison that is stopped keeps the rows it finished.
        meta = {
            "command": f"`{command_line()}`",
            "device": device_name(device),
            "torch": torch.__version__,
            "precision": "32-true",
            "commit": started_at,
            "load": f"{os.getloadavg()[0]:.2f} at the end",
        }
        for path in write_table(args.out, f"Training budget: {args.minutes:g} minutes per recipe", meta, rows):
            print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
