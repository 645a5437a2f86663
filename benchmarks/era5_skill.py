"""Skill of station + reanalysis models on unseen days, under context layouts they were not trained on.

Score one checkpoint:

    python benchmarks/era5_skill.py --config recipes/era5_swin.yaml --ckpt runs/demo/checkpoints/last.ckpt \
        --layout train=4:0,0 --layout shifted=4:1,0 --layout coarse3=3:0,0 --draws 2 --calibrate \
        --json runs/demo/skill.json

Or fit several recipes with ``gridtnp fit`` and print them side by side, the classical baselines beside the
models (the table of docs/results.md):

    python benchmarks/era5_skill.py --recipe recipes/era5_mos.yaml --recipe recipes/era5_mos_kriging.yaml \
        --recipe recipes/era5_swin.yaml --refit era5_mos --refit era5_mos_kriging \
        --layout train=4:0,0 --layout shifted=4:1,0 --layout coarse3=3:0,0 \
        --runs runs/skill --out benchmarks/results/era5_skill_cpu.md

Each ``--recipe`` is fitted into ``RUNS/<recipe name>`` (a run that already has a checkpoint there is reused and
its fit time read from the earlier record), and its best-validation checkpoint is scored under every layout. A
recipe named by ``--refit`` is also fitted again on each other layout (its blocks and the stencil spacing of a
``mos`` decoder moved there) and scored on that layout: "refitted" rows beside the rows of the model fitted on the
first layout.

Each ``--layout NAME=C:LAT,LON`` evaluates the test split (every hour, ``--draws`` context draws per hour, seeds
fixed) with the coarse context in ``C x C`` blocks whose first edge is ``LAT, LON`` fine cells from the store's
first row / column (``4:0,0`` is the sample recipes' evaluation layout; ``4:1,0`` starts the blocks one 0.25 degree
row further north). Per layout, in kelvin and unweighted over stations: RMSE at held-out stations, at context
stations and at all, the coarse cell's RMSE at held-out stations (``baseline``), 90 % coverage and mean z^2
(``z = (y - mean) / std``; 1 when calibrated) at held-out, context and all stations, and the log-likelihood in nats
per target with y in kelvin. Predictions carry the checkpoint's own variance calibration, as ``gridtnp test``.
``--calibrate`` also fits one predictive-std scale on the validation days (training layout: ``s^2`` = mean z^2) and
reports the test metrics with it applied (``cal`` rows).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import command_line, device_name, git_commit, relative, run_record, write_table

from gridtnp.metrics import central_interval_halfwidth, standard_normal_log_density
from gridtnp.module import NeuralProcessModule
from gridtnp.training.checkpointing import best_checkpoint

Layout = tuple[int, tuple[int, int]]  # (block size in fine cells, first block edge in fine cells)


def data_module(config: dict[str, Any], **overrides: Any) -> Any:
    """The recipe's DataModule with keys of its ``task:`` section overridden."""
    spec = config["data"]
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    init = spec.get("init_args", {})
    dm = cls(**{**init, "task": {**init.get("task", {}), **overrides}})
    dm.setup()
    return dm


@torch.no_grad()
def predictions(model: NeuralProcessModule, loader: Any) -> dict[str, np.ndarray]:
    """Mean, std, y (kelvin), mask, is_context and the coarse baseline's squared error, ``[tasks, stations]``."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("mean", "std", "y", "mask", "is_context", "coarse")}
    for batch in loader:
        dist = model.calibrate(model(batch), batch)
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

    def mean(values: np.ndarray, where: np.ndarray) -> float:
        return float(np.mean(values[where])) if where.any() else float("nan")

    return {
        "rmse_heldout": math.sqrt(mean(err**2, held)),
        "rmse_context": math.sqrt(mean(err**2, ctx)),
        "rmse_all": math.sqrt(mean(err**2, every)),
        "baseline_heldout": math.sqrt(mean(p["coarse"], held)),
        "coverage90_heldout": mean(np.abs(z) <= half, held),
        "coverage90_all": mean(np.abs(z) <= half, every),
        "mean_z2_heldout": mean(z**2, held),
        "mean_z2_context": mean(z**2, ctx),
        "mean_z2_all": mean(z**2, every),
        "loglik_physical_all": mean(logp, every),
        "loglik_physical_heldout": mean(logp, held),
        "targets": int(every.sum()),
    }


def parse_layouts(texts: list[str]) -> dict[str, Layout]:
    """``NAME=C:LAT,LON`` strings -> ``{name: (C, (LAT, LON))}``; the first is the layout models are fitted on."""
    layouts = {}
    for text in texts or ["train=4:0,0"]:
        name, _, spec = text.partition("=")
        factor, _, offset = spec.partition(":")
        lat, lon = (int(o) for o in offset.split(","))
        layouts[name] = (int(factor), (lat, lon))
    return layouts


def score_layouts(
    config: dict[str, Any], model: NeuralProcessModule, layouts: dict[str, Layout], draws: int, split: str
) -> dict[str, dict[str, float]]:
    """``scores`` of ``model`` on the ``split`` days under each layout."""
    rows = {}
    for name, (factor, offset) in layouts.items():
        dm = data_module(config, eval_coarsen=factor, eval_offset=offset, eval_draws=draws)
        loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
        rows[name] = scores(predictions(model, loader))
    return rows


def refitted(config: dict[str, Any], layout: Layout, fitted_on: Layout) -> dict[str, Any]:
    """``config`` trained and validated on ``layout``: its blocks there, a ``mos`` stencil at the new spacing."""
    config = copy.deepcopy(config)
    factor, offset = layout
    data = config["data"]["init_args"].setdefault("task", {})
    data.update(coarsen=factor, coarsen_offset=list(offset), eval_coarsen=factor, eval_offset=list(offset))
    decoder = config["model"]["init_args"].get("grid_decoder", {})
    if "spacing" in decoder:
        decoder["spacing"] = decoder["spacing"] * factor / fitted_on[0]
    return config


def fit(config: dict[str, Any], run: Path, threads: int | None = None) -> dict[str, Any]:
    """``gridtnp fit`` of ``config`` into ``run`` (reused if it has a checkpoint) on ``threads`` torch threads (else
    torch's default, one per core): the best checkpoint and the cost."""
    record = run / "fit.json"
    if not (run / "checkpoints" / "last.ckpt").exists():
        run.mkdir(parents=True, exist_ok=True)
        (run / "recipe.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        command = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", str(run / "recipe.yaml")]
        command += ["--trainer.default_root_dir", str(run), "--checkpoint.dirpath", str(run / "checkpoints")]
        print("$", " ".join(command), flush=True)
        start = time.perf_counter()
        env = os.environ | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
        subprocess.run(command, check=True, env=env)
        record.write_text(json.dumps({"fit_seconds": round(time.perf_counter() - start, 1), "threads": threads}))
    ckpt, _, _ = best_checkpoint(run / "checkpoints")
    steps = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    batch = config["data"]["init_args"].get("loader", {}).get("batch_size")
    seconds = json.loads(record.read_text())["fit_seconds"] if record.exists() else None
    return {"ckpt": ckpt, "budget": f"{steps} x {batch}" + (f", {seconds:.0f} s" if seconds else "")}


def compare(args: argparse.Namespace, layouts: dict[str, Layout]) -> None:
    """Fit every ``--recipe`` (and the ``--refit`` ones per layout) and write one table of their skill."""
    started_at = git_commit()
    first_name, first = next(iter(layouts.items()))
    rows = []
    for recipe in args.recipe:
        config = yaml.safe_load(recipe.read_text())
        model_rows = []
        result = fit(config, args.runs / recipe.stem, args.threads)
        model = NeuralProcessModule.load_from_checkpoint(result["ckpt"], map_location="cpu").eval()
        for name, row in score_layouts(config, model, layouts, args.draws, "test").items():
            model_rows.append((recipe.stem, first_name, result["budget"], name, row))
        if recipe.stem in args.refit:
            for name, layout in list(layouts.items())[1:]:
                again = refitted(config, layout, first)
                result = fit(again, args.runs / f"{recipe.stem}-{name}", args.threads)
                model = NeuralProcessModule.load_from_checkpoint(result["ckpt"], map_location="cpu").eval()
                row = score_layouts(again, model, {name: layout}, args.draws, "test")[name]
                model_rows.append((f"{recipe.stem} (refitted)", name, result["budget"], name, row))
        for model_name, fitted, budget, layout, row in model_rows:
            rows.append(
                {
                    "model": model_name,
                    "fitted on": fitted,
                    "budget (steps x batch, fit time)": budget,
                    "layout": layout,
                    "held-out RMSE (K)": f"{row['rmse_heldout']:.3f}",
                    "held-out loglik": f"{row['loglik_physical_heldout']:.3f}",
                    "held-out z^2": f"{row['mean_z2_heldout']:.2f}",
                    "held-out coverage 90": f"{row['coverage90_heldout']:.3f}",
                    "context RMSE (K)": f"{row['rmse_context']:.3f}",
                    "context z^2": f"{row['mean_z2_context']:.2f}",
                    "all RMSE (K)": f"{row['rmse_all']:.3f}",
                }
            )
            print(rows[-1], flush=True)
    meta = {
        "command": f"`{command_line()}`",
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "commit": started_at,
        "load": f"{os.getloadavg()[0]:.2f} at the end (fit times are rough when it exceeds the number of cores)",
        "data": f"the embedded sample's test days, every hour, {args.draws} context draw(s) per hour, seeds fixed",
        "layouts": ", ".join(f"{n} = {f} x {f} blocks from cell {o}" for n, (f, o) in layouts.items()),
    }
    for path in write_table(args.out, "ERA5 sample: classical baselines and models at held-out stations", meta, rows):
        print(f"wrote {path}")


def score_one(args: argparse.Namespace, layouts: dict[str, Layout]) -> None:
    """Score one checkpoint under every layout (and with a validation-fitted std scale with ``--calibrate``)."""
    config = yaml.safe_load(args.config.read_text())
    model = NeuralProcessModule.load_from_checkpoint(args.ckpt, map_location="cpu").eval()
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, help="the recipe the checkpoint was trained with")
    p.add_argument("--ckpt", type=Path, help="score this checkpoint (with --config)")
    p.add_argument("--recipe", type=Path, action="append", default=[], help="fit and score this recipe (repeatable)")
    p.add_argument("--refit", action="append", default=[], help="recipe name to refit on every other layout")
    p.add_argument("--runs", type=Path, default=Path("runs/skill"), help="where --recipe runs are written")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/era5_skill_cpu.md"))
    p.add_argument("--layout", action="append", default=[], help="NAME=C:LAT,LON (repeatable); default train=4:0,0")
    p.add_argument("--draws", type=int, default=2, help="context draws per test hour (2)")
    p.add_argument("--split", default="test", choices=["val", "test"])
    p.add_argument("--calibrate", action="store_true", help="also report a std scale fitted on the validation days")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="append one JSON line with every number")
    args = p.parse_args()
    if bool(args.recipe) == bool(args.ckpt) or bool(args.ckpt) != bool(args.config):
        p.error("give either --config and --ckpt (score one checkpoint) or one or more --recipe (fit and compare)")
    unknown = set(args.refit) - {r.stem for r in args.recipe}
    if unknown:
        p.error(f"--refit {sorted(unknown)}: not among the --recipe names {[r.stem for r in args.recipe]}")
    if args.threads:
        torch.set_num_threads(args.threads)
    layouts = parse_layouts(args.layout)
    if args.recipe:
        compare(args, layouts)
    else:
        score_one(args, layouts)


if __name__ == "__main__":
    main()
