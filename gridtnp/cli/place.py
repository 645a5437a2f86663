"""``gridtnp place``: K new station sites for a checkpoint, chosen greedily by the drop of its predictive variance
over a region (``gridtnp.inference.placement``), written as ``placement.csv`` and ``placement.png``.

gridtnp place --ckpt_path runs/.../last.ckpt --candidates grid --count 5 --hours 8 --out placement/
gridtnp place --config recipes/era5_swin.yaml --ckpt_path last.ckpt --candidates sites.csv --count 3 --out placement/
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gridtnp.batch import Observations
from gridtnp.files import atomic_write, check_output
from gridtnp.registry import ConfigError

OUTPUTS = ("placement.csv", "placement.png")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gridtnp place",
        description="Propose new station sites for a checkpoint: at each of --count rounds, every remaining "
        "candidate is added to the context of --hours tasks of the split (its value: the model's predictive mean "
        "there), and the one that lowers the mean predictive variance over the region most is kept. Writes "
        "placement.csv (the sites in order with their gains) and placement.png (the map) in --out. Other --model.* "
        "/ --data.* arguments override the recipe as in `gridtnp test`.",
    )
    parser.add_argument("--config", action="append", help="the recipe (default: the config.yaml beside --ckpt_path)")
    parser.add_argument("--ckpt_path", required=True, type=Path, help="checkpoint (.ckpt) to load the weights from")
    parser.add_argument("--out", required=True, type=Path, help="folder for placement.csv and placement.png")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier placement in --out")
    parser.add_argument(
        "--candidates",
        default="grid",
        help="'grid' (a regular grid over the region, --candidate_shape) or a CSV file with one column per input "
        "(latitude, longitude; or x0, x1, ...) and an optional name column",
    )
    parser.add_argument("--candidate_shape", type=int, nargs="+", default=[12], help="grid candidates per input")
    parser.add_argument("--count", type=int, default=5, help="sites to choose (K)")
    parser.add_argument("--hours", type=int, default=4, help="tasks of the split, spread evenly over it, averaged")
    parser.add_argument("--split", choices=["val", "test"], default="test", help="the fixed task set drawn from")
    parser.add_argument(
        "--region",
        type=float,
        nargs="+",
        metavar="BOUND",
        help="the box the variance is summed over: lower bounds then upper bounds, one per input (e.g. 50 -6 55 2 "
        "for 50-55 N, 6 W-2 E); default: the model's grid, else the extent of the tasks' targets",
    )
    parser.add_argument("--region_shape", type=int, nargs="+", default=[24], help="region points per input")
    parser.add_argument("--source", help="the context source new stations join (default: the model's target source)")
    parser.add_argument("--max_tasks", type=int, default=64, help="tasks (candidates x hours) a forward")
    parser.add_argument(
        "--geographic", choices=["auto", "yes", "no"], default="auto", help="inputs are (latitude, longitude)"
    )
    return parser


def _per_input(values: list[int], dim_x: int, option: str) -> list[int]:
    """``values`` as one entry per input: one value repeated, or ``dim_x`` values."""
    if len(values) == 1:
        values = values * dim_x
    if len(values) != dim_x or min(values) < 1:
        raise ConfigError(f"{option} {' '.join(map(str, values))}: expected 1 or {dim_x} sizes >= 1.")
    return values


def _pad(obs: Observations, n: int) -> Observations:
    """``obs [B, N, ...]`` padded (masked out) to ``n`` points."""
    extra = n - obs.x.shape[1]
    if extra == 0:
        return obs
    pad = torch.nn.functional.pad
    return Observations(pad(obs.x, (0, 0, 0, extra)), pad(obs.y, (0, 0, 0, extra)), pad(obs.mask, (0, extra)), obs.name)


def _concat(parts: list[Observations]) -> Observations:
    """Observations of several batches as one ``[sum B, max N, ...]``, padded."""
    n = max(p.x.shape[1] for p in parts)
    padded = [_pad(p, n) for p in parts]
    return Observations(
        torch.cat([p.x for p in padded]), torch.cat([p.y for p in padded]), torch.cat([p.mask for p in padded]),
        parts[0].name,
    )  # fmt: skip


def split_tasks(module: Any, datamodule: Any, split: str, hours: int) -> tuple[dict[str, Observations], Observations]:
    """Context ``{source: [H, N, ...]}`` and targets of ``hours`` tasks of the split, spread evenly over it (the
    first ``hours`` of a loader without a length)."""
    datamodule.setup("validate" if split == "val" else "test")
    loader = datamodule.val_dataloader() if split == "val" else datamodule.test_dataloader()
    try:
        batches: int | None = len(loader)
    except TypeError:  # a stream without a length: its first tasks
        batches = None
    wanted: np.ndarray | None = None
    contexts: dict[str, list[Observations]] = {}
    targets: list[Observations] = []
    first = 0
    for batch in loader:
        size = batch.batch_size
        if wanted is None:
            last = batches * size - 1 if batches is not None else hours - 1
            wanted = np.unique(np.linspace(0, last, hours).round().astype(int))
        pick = torch.from_numpy(wanted[(wanted >= first) & (wanted < first + size)] - first)
        first += size
        if len(pick):
            for name, obs in batch.context.items():
                contexts.setdefault(name, []).append(Observations(obs.x[pick], obs.y[pick], obs.mask[pick], name))
            t = batch.target
            targets.append(Observations(t.x[pick], t.y[pick], t.mask[pick], t.name))
        if first > wanted[-1]:
            break
    if not targets:
        raise ConfigError(f"gridtnp place: the {split} split has no tasks.")
    context = {name: _concat(parts) for name, parts in contexts.items()}
    return {k: v.to(module.device) for k, v in context.items()}, _concat(targets)


def region_box(module: Any, targets: Observations, bounds: list[float] | None) -> tuple[list[float], list[float]]:
    """The region's lower and upper bounds: ``--region``, else the model's grid, else the targets' extent."""
    dim_x = targets.x.shape[-1]
    if bounds is not None:
        if len(bounds) != 2 * dim_x or any(lo >= hi for lo, hi in zip(bounds[:dim_x], bounds[dim_x:], strict=True)):
            raise ConfigError(
                f"--region {' '.join(f'{b:g}' for b in bounds)}: expected {dim_x} lower bounds then {dim_x} upper "
                "bounds, each lower below its upper."
            )
        return bounds[:dim_x], bounds[dim_x:]
    grid = getattr(getattr(module, "model", module), "grid", None)
    if grid is not None:
        return [float(v) for v in grid.lower], [float(v) for v in grid.upper]
    x = targets.x[targets.mask].double()
    return x.amin(0).tolist(), x.amax(0).tolist()


def place_main(args: list[str]) -> None:
    """``gridtnp place --ckpt_path CKPT [--config RECIPE] --candidates grid|FILE.csv --count K --hours H --out DIR``."""
    from gridtnp.cli.evaluate import load_checkpoint, quiet_lightning_info
    from gridtnp.inference.inputs import checkpoint_statistics, geographic_inputs, longitude_centre
    from gridtnp.inference.placement import (
        box_points,
        greedy_placement,
        placement_table,
        read_candidates,
        squared_units,
    )
    from gridtnp.report.placement_map import placement_figure
    from gridtnp.report.plots import is_geographic
    from gridtnp.training.config_saving import CONFIG_NAME

    parser = _parser()
    opts, rest = parser.parse_known_args(args)
    for option in ("count", "hours", "max_tasks"):
        if getattr(opts, option) < 1:
            parser.error(f"--{option} must be >= 1; got {getattr(opts, option)}")
    if not opts.ckpt_path.is_file():
        parser.error(f"--ckpt_path {opts.ckpt_path}: no such file")
    if not opts.config:
        beside = opts.ckpt_path.with_name(CONFIG_NAME)
        if not beside.is_file():
            parser.error(f"--config not given and no {CONFIG_NAME} beside {opts.ckpt_path}: name the recipe")
        opts.config = [str(beside)]
    if opts.candidates != "grid" and not Path(opts.candidates).is_file():
        parser.error(f"--candidates {opts.candidates}: no such file; give 'grid' or a CSV file of sites")
    for name in OUTPUTS:
        check_output(opts.out / name, "placement", "--overwrite", opts.overwrite, lambda p: p.is_file())
    with quiet_lightning_info():
        cli = load_checkpoint(opts.config, opts.ckpt_path, rest)
        module, datamodule = cli.model, cli.datamodule
        context, targets = split_tasks(module, datamodule, opts.split, opts.hours)
    dim_x = targets.x.shape[-1]
    geographic = is_geographic(datamodule) if opts.geographic == "auto" else opts.geographic == "yes"
    coords = ["latitude", "longitude"] if geographic and dim_x == 2 else [f"x{d}" for d in range(dim_x)]
    lower, upper = region_box(module, targets, opts.region)
    region = box_points(lower, upper, _per_input(opts.region_shape, dim_x, "--region_shape"))
    if opts.candidates == "grid":
        candidates = box_points(lower, upper, _per_input(opts.candidate_shape, dim_x, "--candidate_shape"))
        names = [f"grid{i}" for i in range(len(candidates))]
    else:
        candidates, names = read_candidates(opts.candidates, coords)
        if geographic:
            centre = longitude_centre(getattr(module, "model", module), coords)
            candidates = geographic_inputs(candidates, coords, f"--candidates {opts.candidates}", centre)
    if opts.count > len(candidates):
        raise ConfigError(f"--count {opts.count}: more than the {len(candidates)} candidates.")
    dtype = context[next(iter(context))].x.dtype
    _, stats, attrs = checkpoint_statistics(module)
    scale, units = (stats[0][1], attrs[0]["units"]) if stats else (None, "")

    def progress(round_: int, site: int, gain: float) -> None:
        where = ", ".join(f"{v:.4g}" for v in candidates[site])
        value = f"{gain * scale**2:.4g} {squared_units(units, '^2')}" if scale else f"{gain:.4g} (normalised)"
        print(f"gridtnp place: round {round_}/{opts.count}: {names[site]} ({where}), gain {value}", flush=True)

    hours = next(iter(context.values())).x.shape[0]
    print(f"gridtnp place: {len(candidates)} candidates, {len(region)} region points, {hours} hours", flush=True)
    placement = greedy_placement(
        module, context, torch.tensor(region, dtype=dtype), torch.tensor(candidates, dtype=dtype), opts.count,
        opts.source, opts.max_tasks, progress=progress,
    )  # fmt: skip
    table = placement_table(placement, coords, names, scale, units)
    opts.out.mkdir(parents=True, exist_ok=True)
    atomic_write(opts.out / "placement.csv", lambda f: f.write(table.to_csv(index=False).encode()))
    source = opts.source or getattr(module, "target_source", None) or next(iter(context))
    existing = context[source].x[0][context[source].mask[0]].cpu().numpy() if source in context else np.zeros((0, 2))
    figure = placement_figure(placement, candidates, region, existing, geographic, scale or 1.0, units or "normalised")
    figure.suptitle(f"{opts.count} new sites, {len(candidates)} candidates, {hours} hours")
    figure.savefig(opts.out / "placement.png", dpi=110)
    gains = ", ".join(f"{g:.4g}" for g in (placement.gains * scale**2 if scale else placement.gains))
    print(
        f"gridtnp place: {opts.count} sites of {len(candidates)} candidates over {hours} hours; "
        f"gains {gains} {squared_units(units, '^2') if scale else '(normalised)'}; written to "
        f"{opts.out / 'placement.csv'} and placement.png"
    )
