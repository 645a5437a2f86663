"""Train a recipe for a wall-clock budget through ``gridtnp fit`` and set what the model consumes against what
the DataLoader delivers: tasks per second, time waiting for data and (on CUDA) GPU utilisation.

    # the paper-scale station task on a synthetic global store built by gridtnp data prepare (96 hours)
    python benchmarks/gpu_training.py recipes/era5_swin_global.yaml --global-hours 96 --minutes 4 \
        --precision bf16-mixed --loader-workers 8 15 --out benchmarks/results/gpu_training_global_h100
    # the main recipe on the embedded sample, then its test set with the best-validation checkpoint
    python benchmarks/gpu_training.py recipes/era5_swin.yaml --minutes 6 --precision bf16-mixed --test \
        --set trainer.val_check_interval=1000 --out benchmarks/results/gpu_training_era5_swin_h100

The fit runs in a subprocess with the recipe (plus ``--set`` overrides), ``trainer.max_time`` set to the budget
and ``max_steps`` lifted, and ``gridtnp.training.throughput.Throughput`` in its callbacks; that callback's
summary (after 20 warm-up steps) is the "consumed" row. The "delivered" rows iterate the recipe's training
DataLoader alone, in this process, for ``--loader-batches`` batches with each ``--loader-workers`` count.
``--global-hours`` writes daily global 0.25 degree NetCDF files of t2m and skt (the fields of
``benchmarks/data_loading.py --scale``), prepares them with ``gridtnp data prepare --climatology`` and points the
recipe's data at that store with the first days for training and the last day split into validation and test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_loading import daily_files, loader_rate, timed_prepare  # noqa: E402
from harness import command_line, device_name, git_commit, repo_env, write_table  # noqa: E402
from train_budget import instantiate  # noqa: E402

from gridtnp.training.checkpointing import checkpoint_step  # noqa: E402


def set_path(config: dict[str, Any], dotted: str, value: Any) -> None:
    """``config["a"]["b"] = value`` for ``"a.b"``, creating missing mappings."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        config = config.setdefault(key, {})
    config[leaf] = value


def global_store(
    folder: Path, hours: int, reuse: bool, jobs: int
) -> tuple[Path, dict[str, Any], dict[str, float] | None]:
    """The prepared global store of ``hours`` hours (its NetCDF files written by ``jobs`` processes), the data
    overrides that use it, and prepare's timing (None when ``reuse`` found the store already prepared)."""
    days = -(-hours // 24)
    if days < 2:
        raise SystemExit("--global-hours needs at least 48: training days, then a day for validation and test")
    files = daily_files(folder / "raw", hours, jobs)
    store = folder / f"era5_global_{hours}h.zarr"
    train_end, last = f"2019-01-{days - 1:02d}", f"2019-01-{days:02d}"
    timing = None
    if not (reuse and store.exists()):  # prepare moves a finished store into place: there means complete
        timing = timed_prepare(files, store, train_end)
    data = {
        "data.init_args.store.path": str(store),
        "data.init_args.splits.train": ["2019-01-01", train_end],
        "data.init_args.splits.val": [f"{last}T00", f"{last}T11"],
        "data.init_args.splits.test": [f"{last}T12", f"{last}T23"],
        "data.init_args.task.climatology": False,
    }
    return store, data, timing


def fit(config: dict[str, Any], run: Path, minutes: float, precision: str) -> dict[str, Any]:
    """``gridtnp fit`` of ``config`` for ``minutes`` in ``run``: the Throughput summary, the wall time and the step
    it resumed from (None for a fresh run). A run whose ``last.ckpt`` exists resumes (``gridtnp fit`` does so by
    itself in an explicit checkpoint folder) and trains until ``minutes`` in all, the earlier runs included."""
    run.mkdir(parents=True, exist_ok=True)
    last = run / "checkpoints" / "last.ckpt"
    resumed = checkpoint_step(last) if last.exists() else None
    summary = run / "throughput.json"
    callback = {"class_path": "gridtnp.training.throughput.Throughput", "init_args": {"summary": str(summary)}}
    config = {**config, "trainer": {**config.get("trainer", {})}}
    config["trainer"]["callbacks"] = [*config["trainer"].get("callbacks", []), callback]
    recipe = run / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config, sort_keys=False))
    seconds = round(minutes * 60)
    command = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", str(recipe),
               "--trainer.precision", precision, "--trainer.max_steps", "-1",
               "--trainer.max_time", f"00:{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}",
               "--trainer.enable_progress_bar", "false",
               "--trainer.default_root_dir", str(run), "--checkpoint.dirpath", str(run / "checkpoints")]  # fmt: skip
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=repo_env())
    wall = round(time.perf_counter() - start, 1)
    return {**json.loads(summary.read_text()), "fit_wall_s": wall, "resumed_step": resumed}


def test(run: Path, precision: str) -> dict[str, float]:
    """``gridtnp test`` of the best-validation checkpoint of ``run``: its metrics."""
    command = [sys.executable, "-m", "gridtnp.cli", "test", "--config", str(run / "recipe.yaml"),
               "--trainer.precision", precision, "--trainer.default_root_dir", str(run),
               "--checkpoint.dirpath", str(run / "checkpoints"), "--ckpt_path", "best"]  # fmt: skip
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=repo_env())
    (newest,) = sorted(run.rglob("*test_metrics*.json"), key=lambda p: p.stat().st_mtime)[-1:]
    return json.loads(newest.read_text())["metrics"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("recipe", type=Path)
    p.add_argument("--minutes", type=float, default=5.0, help="wall-clock training budget (5; 0: the loader only)")
    p.add_argument("--precision", default="bf16-mixed", help="Lightning precision (bf16-mixed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="override a recipe entry")
    p.add_argument("--global-hours", type=int, default=None, help="train on a synthetic global store of N hours")
    p.add_argument("--store-dir", type=Path, default=Path("runs/benchmark_data"))
    p.add_argument("--reuse-store", action="store_true", help="--global-hours: keep a store prepared earlier")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="--global-hours: processes writing the files")
    p.add_argument("--loader-workers", type=int, nargs="*", default=[], help="DataLoader worker counts to time")
    p.add_argument("--loader-batches", type=int, default=60, help="batches per loader measurement (60)")
    p.add_argument("--test", action="store_true", help="then gridtnp test with the best-validation checkpoint")
    p.add_argument("--run", type=Path, default=None, help="run directory (runs/gpu_training/<recipe>)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_training")
    args = p.parse_args()
    commit = git_commit()
    config = yaml.safe_load(args.recipe.read_text())
    bad = [item for item in args.set if "=" not in item or not item.split("=", 1)[0]]
    if bad:
        p.error(f"--set {bad[0]!r}: expected KEY=YAML with a dotted recipe key, e.g. trainer.val_check_interval=500")
    overrides = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    rows: list[dict[str, Any]] = []
    meta = {
        "command": f"`{command_line()}`",
        "device": device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "precision": args.precision,
        "commit": commit,
    }
    if args.global_hours:
        store, data, timing = global_store(args.store_dir, args.global_hours, args.reuse_store, args.jobs)
        overrides = {**data, **overrides}
        meta["store"] = f"{store.name}: synthetic global 0.25 degree t2m + skt, prepared by gridtnp data prepare"
    if args.global_hours and timing is not None:
        rows.append({"measure": "gridtnp data prepare --climatology", "workers": "-", "tasks/s": "-",
                     "notes": f"wall {timing['wall_s']:.0f} s, peak {timing['peak_mb']:.0f} MB, "
                              f"{timing['mb_per_s']:.0f} MB/s of float32"})  # fmt: skip
    for key, value in overrides.items():
        set_path(config, key, value)
    title = f"Training throughput: {args.recipe.stem}, {args.minutes:g} minutes, {args.precision}"

    def write() -> None:  # after every measurement, so an interrupted run keeps what it finished
        for path in write_table(args.out.with_suffix(".md"), title, meta, rows):
            print(f"wrote {path}", flush=True)

    for workers in args.loader_workers:
        init = config["data"]["init_args"]
        loader = {**init.get("loader", {}), "num_workers": workers}
        dm_config = {**config["data"], "init_args": {**init, "loader": loader}}
        r = loader_rate(lambda w, c=dm_config: instantiate(c), workers, args.loader_batches)
        rows.append({"measure": "training DataLoader alone (delivered)", "workers": workers,
                     "tasks/s": f"{r['tasks_per_s']:.1f}",
                     "notes": f"batch {r['batch']}, {r['timed']} batches timed, "
                              f"{r['tasks_per_cpu_s']:.1f} tasks per CPU s"})  # fmt: skip
        print(rows[-1], flush=True)
        write()
    if args.minutes <= 0:  # the store (and the loader) only
        if rows:
            write()
        return
    run = args.run or Path("runs/gpu_training") / args.recipe.stem
    result = fit(config, run, args.minutes, args.precision)
    workers = config["data"]["init_args"].get("loader", {}).get("num_workers", 0)
    rate = "-" if result["tasks_per_s"] is None else f"{result['tasks_per_s']:.1f}"
    notes = f"{result['steps']} steps after {result['warmup_steps']} warm-up, {result['seconds']:.0f} s"
    if result["resumed_step"] is not None:
        notes = f"resumed at step {result['resumed_step']} until {args.minutes:g} minutes in all; " + notes
    if result["steps"]:
        notes += (
            f"; waiting for data {100 * result['data_wait']:.1f} % of it; step {1000 * result['step_seconds']:.1f} ms"
        )
    if "gpu_utilisation_mean" in result:
        notes += (
            f"; GPU utilisation mean {result['gpu_utilisation_mean']:.0f} %, median "
            f"{result['gpu_utilisation_median']:.0f} %, memory used up to {result['gpu_memory_used_gib_max']:.1f} GiB"
        )
    rows.append({"measure": "gridtnp fit (consumed)", "workers": workers, "tasks/s": rate,
                 "notes": notes})  # fmt: skip
    print(rows[-1], flush=True)
    write()
    if args.test:
        metrics = test(run, args.precision)
        keep = [k for k in metrics if k.endswith(("rmse_physical", "loglik_physical", "mean_z2", "coverage_90"))]
        rows.append({"measure": "gridtnp test, best-validation checkpoint", "workers": "-", "tasks/s": "-",
                     "notes": ", ".join(f"{k} {metrics[k]:.4g}" for k in sorted(keep))})  # fmt: skip
        (args.out.parent / f"{args.out.name}_test.json").write_text(json.dumps(metrics, indent=1) + "\n")
        write()


if __name__ == "__main__":
    main()
