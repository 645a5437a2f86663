"""``gridtnp plot`` and ``gridtnp report``: a checkpoint evaluated on a split, as PNG figures or one HTML page.

* ``plot_main(args)``, ``report_main(args)``: the subcommands; ``load_checkpoint(config, ckpt, rest)``: the
  recipe's ``GridTNPCLI`` with the checkpoint's weights, built without running anything.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from gridtnp.cli.guards import (
    check_checkpoint_model,
    is_plot_folder,
)
from gridtnp.cli.lightning import GridTNPCLI
from gridtnp.files import check_output
from gridtnp.registry import ConfigError
from gridtnp.training import checkpoint_loading
from gridtnp.training.checkpointing import (
    resume_checkpoint,
)
from gridtnp.training.config_saving import CONFIG_NAME


def _evaluation_parser(prog: str, description: str, out_help: str) -> argparse.ArgumentParser:
    """The options ``gridtnp plot`` and ``gridtnp report`` share."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config",
        action="append",
        help="the recipe the checkpoint was trained with (default: the config.yaml gridtnp fit wrote beside it)",
    )
    parser.add_argument("--ckpt_path", required=True, type=Path, help="checkpoint (.ckpt) to load the weights from")
    parser.add_argument("--out", required=True, type=Path, help=out_help)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output of this command")
    parser.add_argument("--split", choices=["val", "test"], default="test", help="which fixed task set to draw from")
    parser.add_argument(
        "--geographic",
        choices=["auto", "yes", "no"],
        default="auto",
        help="inputs are (latitude, longitude) in degrees (auto: ask the DataModule)",
    )
    return parser


def parse_evaluation_args(
    parser: argparse.ArgumentParser, args: list[str], num_tasks: int
) -> tuple[argparse.Namespace, list[str]]:
    """``parser``'s options (with ``--num_tasks``, default ``num_tasks``) checked, and the recipe overrides left."""
    parser.add_argument("--num_tasks", type=int, default=num_tasks, help=f"tasks drawn as maps (default {num_tasks})")
    opts, rest = parser.parse_known_args(args)
    if opts.num_tasks < 1:
        parser.error(f"--num_tasks must be >= 1; got {opts.num_tasks}")
    if not opts.ckpt_path.is_file():
        parser.error(f"--ckpt_path {opts.ckpt_path}: no such file")
    if not opts.config:
        beside = opts.ckpt_path.with_name(CONFIG_NAME)
        if not beside.is_file():
            parser.error(
                f"--config not given and no {CONFIG_NAME} beside {opts.ckpt_path}: name the recipe the checkpoint "
                "was trained with (--config recipes/NAME.yaml)"
            )
        opts.config = [str(beside)]
    return opts, rest


@contextlib.contextmanager
def quiet_lightning_info() -> Iterator[None]:
    """Without Lightning's info lines (``Seed set to 0``, ``GPU available: False, used: False``...): ``gridtnp
    plot`` and ``report`` print what they wrote and nothing a user cannot act on (warnings still show)."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.seed")
    loggers = [logging.getLogger(n) for n in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def load_checkpoint(config: list[str], ckpt_path: Path, rest: list[str]) -> GridTNPCLI:
    """The recipe's model and DataModule (``cli.model``, ``cli.datamodule``; other ``--model.* / --data.*``
    arguments override the recipe) with the checkpoint's weights, statistics and variance calibration, in eval mode."""
    if not ckpt_path.is_file():
        raise ConfigError(f"--ckpt_path {ckpt_path}: no such file.")
    resume_checkpoint(ckpt_path, [], None)  # a truncated or corrupt file is an error naming it
    config_args = [a for c in config for a in ("--config", _without_run_options(c))]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when sys.argv has arguments besides ``args``
    try:
        cli = GridTNPCLI(run=False, args=[*config_args, *rest, "--trainer.logger", "false"])
    finally:
        sys.argv = argv
    check_checkpoint_model(ckpt_path, cli.config.get("model"))
    module = cli.model
    checkpoint = checkpoint_loading.load_checkpoint(ckpt_path)  # tensors and plain values only
    if hasattr(module, "on_load_checkpoint"):
        module.on_load_checkpoint(checkpoint)  # the data's statistics, the variance calibration's buffers
    module.load_state_dict(checkpoint["state_dict"])
    module.eval()
    return cli


#: Options of ``gridtnp fit`` that the config.yaml beside the checkpoints records and a loaded model has no use for.
RUN_OPTIONS = ("ckpt_path", "weights_only")


def _without_run_options(config: str) -> str:
    """A recipe path as given, or for a config.yaml that ``gridtnp fit`` saved, its text without ``RUN_OPTIONS``
    (jsonargparse takes a YAML string where it takes a path)."""
    path = Path(config)
    if path.name != CONFIG_NAME or not path.is_file():
        return config
    import yaml

    saved = yaml.safe_load(path.read_text())
    if not isinstance(saved, dict) or not any(k in saved for k in RUN_OPTIONS):
        return config
    return yaml.safe_dump({k: v for k, v in saved.items() if k not in RUN_OPTIONS}, sort_keys=False)


def plot_main(args: list[str]) -> None:
    """``gridtnp plot [--config RECIPE] --ckpt_path CKPT --out DIR [--split val|test] [--num_tasks N]``: PNG files.

    Other arguments (``--data.init_args.store ...``) are passed to the recipe as in ``gridtnp test``.
    """
    parser = _evaluation_parser(
        "gridtnp plot",
        "Write prediction plots of a checkpoint as PNG files: maps of the first tasks (in the data's physical units "
        "where the DataModule converts them), the calibration by kind of target (reliability, PIT, standardised "
        "errors) and, for station tasks, per-station RMSE and time series, over the whole split. "
        "Other --model.* / --data.* arguments override the recipe as in `gridtnp test`.",
        "directory for the PNG files",
    )
    opts, rest = parse_evaluation_args(parser, args, num_tasks=4)
    check_output(opts.out, "plot folder", "--overwrite", opts.overwrite, is_plot_folder)
    from gridtnp.report.evaluation import run_split  # matplotlib only loads for this subcommand and the callback
    from gridtnp.report.evaluation_plots import split_figures

    with quiet_lightning_info():
        cli = load_checkpoint(opts.config, opts.ckpt_path, rest)
        module, datamodule = cli.model, cli.datamodule
        evaluation = run_split(module, datamodule, opts.split, opts.num_tasks)
        geographic = None if opts.geographic == "auto" else opts.geographic == "yes"
        figures = split_figures(evaluation, module, datamodule, geographic)
    opts.out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, figure in figures.items():
        path = opts.out / f"{opts.split}_{name}.png"
        figure.savefig(path, dpi=110)
        written.append(path)
    print(f"gridtnp plot: {len(written)} files in {opts.out}: " + ", ".join(p.name for p in written))


def report_main(args: list[str]) -> None:
    """``gridtnp report [--config RECIPE] --ckpt_path CKPT --out report.html [--compare CKPT_OR_RECIPE ...]``: one
    self-contained HTML page; with ``--compare``, a scorecard of several models on the same tasks."""
    parser = _evaluation_parser(
        "gridtnp report",
        "Evaluate a checkpoint on the test (or validation) split and write one self-contained HTML page: the metric "
        "table (all / context / held-out targets, calibrated and not, the baselines beside), maps, calibration and "
        "per-station figures (embedded, no network needed to view it), the recipe and the checkpoint. With "
        "--compare, other checkpoints or fitted recipes scored on the same tasks: skill against the coarse cell, "
        "who wins at each station, breakdowns by hour, distance to the nearest context station and coast / inland, "
        "and the observation-impact map. Other --model.* / --data.* arguments override every recipe as in "
        "`gridtnp test`.",
        "the HTML file to write",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="CKPT_OR_RECIPE",
        help="other models on the same page: checkpoints (their config.yaml beside them) or recipes fitted into "
        "RUNS/<recipe name>/checkpoints (e.g. era5_mos era5_mos_kriging)",
    )
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where --compare looks for fitted recipes")
    parser.add_argument(
        "--impact_hours",
        type=int,
        default=4,
        help="hours of the split for the observation-impact map with --compare (0: none; each costs one forward "
        "per station)",
    )
    parser.add_argument(
        "--sample_hours",
        type=int,
        default=4,
        help="hours of the split whose joint samples (sample maps, regional mean) are drawn for a joint likelihood "
        "(lowrank_gaussian; 0: none)",
    )
    opts, rest = parse_evaluation_args(parser, args, num_tasks=2)
    if opts.out.suffix.lower() not in (".html", ".htm"):
        parser.error(f"--out {opts.out}: expected an .html file name")
    for name in ("impact_hours", "sample_hours"):
        if getattr(opts, name) < 0:
            parser.error(f"--{name} must be >= 0; got {getattr(opts, name)}")
    from gridtnp.report.compare import resolve_model
    from gridtnp.report.page import is_report, write_report

    check_output(opts.out, "report", "--overwrite", opts.overwrite, is_report)
    others = [resolve_model(spec, opts.runs) for spec in opts.compare]
    geographic = None if opts.geographic == "auto" else opts.geographic == "yes"
    with quiet_lightning_info():
        cli = load_checkpoint(opts.config, opts.ckpt_path, rest)
        # The same batches, and so the same context draws, for every model: the first model's batch size.
        same = ["--data.init_args.loader.batch_size", str(cli.datamodule.batch_size)] if others else []
        loaded = [(load_checkpoint(configs, ckpt, [*rest, *same]), ckpt, configs) for ckpt, configs in others]
        path = write_report(
            cli, opts.ckpt_path, opts.config, opts.out, opts.split, opts.num_tasks, geographic, loaded,
            opts.impact_hours, opts.sample_hours,
        )  # fmt: skip
    print(f"gridtnp report: written to {path}")
