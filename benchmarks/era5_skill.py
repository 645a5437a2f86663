"""Skill of a station + reanalysis checkpoint on unseen days, under context layouts it was not trained on.

    python benchmarks/era5_skill.py --config recipes/era5_swin.yaml --ckpt runs/demo/checkpoints/last.ckpt \
        --layout train=4:0,0 --layout shifted=4:1,0 --layout coarse3=3:0,0 --draws 2 --calibrate \
        --json runs/demo/skill.json

Each ``--layout NAME=C:LAT,LON`` evaluates the test split (every hour, ``--draws`` context draws per hour, seeds
fixed) with the coarse context in ``C x C`` blocks whose first edge is ``LAT, LON`` fine cells from the store's
first row / column (``4:0,0`` is the sample recipes' evaluation layout; ``4:1,0`` starts the blocks one 0.25 degree
row further north). Per layout, in kelvin and unweighted over stations: RMSE at held-out stations, at context
stations and at all, the coarse cell's RMSE at held-out stations (``baseline``), 90 % coverage and mean z^2
(``z = (y - mean) / std``; 1 when calibrated) at held-out and all stations, and the log-likelihood in nats per
target with y in kelvin. ``--calibrate`` also fits one predictive-std scale on the validation days (training
layout: ``s^2`` = mean z^2) and reports the test metrics with it applied (``cal`` rows).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import relative, run_record

from gridtnp.metrics import central_interval_halfwidth, standard_normal_log_density
from gridtnp.module import NeuralProcessModule


def data_module(config: dict[str, Any], **overrides: Any) -> Any:
    """The recipe's DataModule with ``init_args`` overridden."""
    spec = config["data"]
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    dm = cls(**{**spec.get("init_args", {}), **overrides})
    dm.setup()
    return dm


@torch.no_grad()
def predictions(model: NeuralProcessModule, loader: Any) -> dict[str, np.ndarray]:
    """Mean, std, y (kelvin), mask, is_context and the coarse baseline's squared error, ``[tasks, stations]``."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("mean", "std", "y", "mask", "is_context", "coarse")}
    for batch in loader:
        dist = model(batch)
        scale = batch.extras["target_scale"].view(-1, 1).numpy()
        parts["mean"].append(dist.mean[..., 0].float().numpy() * scale)
        parts["std"].append(dist.stddev[..., 0].float().numpy() * scale)
        parts["y"].append(batch.target.y[..., 0].numpy() * scale)
        parts["mask"].append(batch.target.valid().numpy())
        parts["is_context"].append(batch.extras["is_context"].numpy())
        parts["coarse"].append(batch.extras["coarse_sq_err"].numpy() * scale**2)
    return {k: np.concatenate(v) for k, v in parts.items()}


def scores(p: dict[str, np.ndarray], std_scale: float = 1.0) -> dict[str, float]:
    """Skill at held-out, context and all stations (kelvin; z and coverage with the std times ``std_scale``)."""
    std = p["std"] * std_scale
    err, z = p["mean"] - p["y"], (p["mean"] - p["y"]) / std
    logp = standard_normal_log_density(torch.from_numpy(z)).numpy() - np.log(std)  # y in kelvin
    held, ctx, every = p["mask"] & ~p["is_context"], p["mask"] & p["is_context"], p["mask"]
    half = central_interval_halfwidth(0.9)
    out = {
        "rmse_heldout": float(np.sqrt(np.mean(err[held] ** 2))),
        "rmse_context": float(np.sqrt(np.mean(err[ctx] ** 2))) if ctx.any() else float("nan"),
        "rmse_all": float(np.sqrt(np.mean(err[every] ** 2))),
        "baseline_heldout": float(np.sqrt(np.mean(p["coarse"][held]))),
        "coverage90_heldout": float(np.mean(np.abs(z[held]) <= half)),
        "coverage90_all": float(np.mean(np.abs(z[every]) <= half)),
        "mean_z2_heldout": float(np.mean(z[held] ** 2)),
        "mean_z2_all": float(np.mean(z[every] ** 2)),
        "loglik_physical_all": float(np.mean(logp[every])),
        "loglik_physical_heldout": float(np.mean(logp[held])),
        "targets": int(every.sum()),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, required=True, help="the recipe the checkpoint was trained with")
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--layout", action="append", default=[], help="NAME=C:LAT,LON (repeatable); default train=4:0,0")
    p.add_argument("--draws", type=int, default=2, help="context draws per test hour (2)")
    p.add_argument("--split", default="test", choices=["val", "test"])
    p.add_argument("--calibrate", action="store_true", help="also report a std scale fitted on the validation days")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="append one JSON line with every number")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = yaml.safe_load(args.config.read_text())
    model = NeuralProcessModule.load_from_checkpoint(args.ckpt, map_location="cpu").eval()
    layouts = {}
    for text in args.layout or ["train=4:0,0"]:
        name, _, spec = text.partition("=")
        factor, _, offset = spec.partition(":")
        layouts[name] = (int(factor), tuple(int(o) for o in offset.split(",")))
    scale = 1.0
    if args.calibrate:
        first = next(iter(layouts.values()))
        val = data_module(config, eval_coarsen=first[0], eval_offset=first[1], eval_draws=args.draws)
        val_pred = predictions(model, val.val_dataloader())
        scale = math.sqrt(scores(val_pred)["mean_z2_all"])
        print(f"std scale fitted on the validation days: {scale:.3f}")
    rows = {}
    for name, (factor, offset) in layouts.items():
        dm = data_module(config, eval_coarsen=factor, eval_offset=offset, eval_draws=args.draws)
        loader = dm.test_dataloader() if args.split == "test" else dm.val_dataloader()
        pred = predictions(model, loader)
        rows[name] = scores(pred)
        if args.calibrate:
            rows[f"{name} cal"] = scores(pred, scale)
    keys = list(next(iter(rows.values())))
    print("| layout | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(
            f"| {name} | "
            + " | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys)
            + " |"
        )
    if args.json:
        record = {
            "config": relative(args.config),
            "ckpt": relative(args.ckpt),
            "split": args.split,
            "draws": args.draws,
            "std_scale": scale,
            **run_record(torch.device("cpu")),
            "layouts": {k: {"coarsen": f, "offset": list(o)} for k, (f, o) in layouts.items()},
            "scores": rows,
        }
        with args.json.open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
