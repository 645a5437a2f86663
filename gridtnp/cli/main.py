"""``gridtnp``: ``fit | validate | test | predict`` through LightningCLI, ``list`` for the registry, ``data prepare``,
``plot`` for PNG figures of a checkpoint's predictions, ``report`` for one HTML page of its evaluation.

gridtnp fit --config recipes/gp1d_tnp.yaml --trainer.max_steps 300
gridtnp plot --config recipes/gp1d_tnp.yaml --ckpt_path runs/.../last.ckpt --out plots/
gridtnp report --config recipes/era5_swin.yaml --ckpt_path runs/.../last.ckpt --out report.html
gridtnp list processor
gridtnp list processor swin
gridtnp list model --params
gridtnp data prepare era5.nc --out era5.zarr --train-start 2019-03-01 --train-end 2019-03-21
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from gridtnp.cli.guards import argument_error_line, check_checkpoint_model, find_config_error, is_plot_folder
from gridtnp.cli.reports import ProgressLog, format_metrics, metrics_path, quiet_third_party
from gridtnp.files import check_output, is_url
from gridtnp.registry import KINDS, ConfigError, available, describe, document
from gridtnp.training.checkpointing import (
    LOGGER_VERSION,
    Checkpoint,
    SaveConfig,
    best_checkpoint,
    checkpoint_entry,
    checkpoint_step,
    resume_checkpoint,
)

__all__ = ["GridTNPCLI", "main"]


class GridTNPCLI(LightningCLI):
    """LightningCLI for any ``NeuralProcessModule`` and ``LightningDataModule`` (``class_path`` in the recipe),
    with gridtnp's trainer defaults, a best/last checkpoint callback (``--checkpoint.*``), prediction plots logged to
    TensorBoard (``--plots.*``, ``gridtnp.plots.PlotCallback``), a prediction writer (``--predictions.*``), the
    parameter count printed, and the test metrics printed as a table and written to JSON.

    ``fit`` resumes from the newest readable checkpoint with ``--ckpt_path last``, and by itself when an explicitly
    set ``--checkpoint.dirpath`` already holds checkpoints (a requeued job reruns the same command); the resolved
    config is saved beside the checkpoints.
    """

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        from gridtnp.module import NeuralProcessModule

        kwargs.setdefault("trainer_defaults", trainer_defaults())
        kwargs.setdefault("save_config_callback", SaveConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # Raise instead of printing the usage text first: main() turns the error into one line with a hint.
        no_exit = {"exit_on_error": False}
        kwargs.setdefault(
            "parser_kwargs", {**no_exit, **{sub: no_exit for sub in ("fit", "validate", "test", "predict")}}
        )
        super().__init__(
            NeuralProcessModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        from gridtnp.plots import PlotCallback
        from gridtnp.predictions import PredictionWriter

        parser.add_lightning_class_args(Checkpoint, "checkpoint")
        parser.add_lightning_class_args(PlotCallback, "plots")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.add_lightning_class_args(ProgressLog, "progress")
        parser.add_argument(
            "--allow_untrained",
            type=bool,
            default=False,
            help="let test / predict run without --ckpt_path, on the model's initial (untrained) weights",
        )
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/loglik",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.last_every_n_steps": 1000,
            }
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as LightningCLI does; ``--print_config`` prints the config with the model's components expanded
        (preset resolved, every argument of every slot with the value the model builds it with) and exits."""
        argv = None if isinstance(args, dict | Namespace) else list(sys.argv[1:] if args is None else args)
        if argv is None or not any(a == "--print_config" or a.startswith("--print_config=") for a in argv):
            super().parse_arguments(parser, args)
            return
        self.config = parser.parse_args([a for a in argv if not a.startswith("--print_config")])
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        init_args = config.get("model", {}).get("init_args")
        from gridtnp.models.neural_process import MODEL_KEYS, SLOTS, expand_spec

        if init_args is not None and all(slot in init_args for slot in SLOTS):
            spec = {k: v for k, v in init_args.as_dict().items() if k in (*MODEL_KEYS, "preset")}
            for key, value in {**expand_spec(spec), "preset": None}.items():
                init_args[key] = value
        config.pop("config", None)
        print(self._parser(subcommand).dump(config, skip_none=False), end="")
        raise SystemExit(0)

    def before_fit(self) -> None:
        rank_zero = rank_zero_only.rank == 0  # the trainer's ranks are only set once fit starts
        n = getattr(self.model, "num_parameters", None)
        if n is not None and rank_zero:
            print(f"gridtnp: {type(self.model).__name__} with {n:,} trainable parameters")
        config = self.config_init[self.subcommand]
        explicit_dirs = [cb.dirpath for cb in self.trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
        ckpt_path = resume_checkpoint(config.get("ckpt_path"), explicit_dirs, self.trainer.default_root_dir)
        if ckpt_path is not None and ckpt_path != config.get("ckpt_path") and rank_zero:
            step = checkpoint_step(ckpt_path)
            print(f"gridtnp: resuming from {ckpt_path} (global step {step})", flush=True)
        config["ckpt_path"] = ckpt_path
        version = checkpoint_entry(ckpt_path, LOGGER_VERSION) if ckpt_path not in (None, "last") else None
        logger = self.trainer.logger
        if version is not None and isinstance(logger, TensorBoardLogger) and logger.version != version:
            # Continue the run's TensorBoard folder instead of starting version_N+1 (one continuous curve).
            self.trainer.loggers = [TensorBoardLogger(save_dir=logger.save_dir, name=logger.name, version=version)]

    def before_instantiate_classes(self) -> None:
        """Trainer values Lightning would reject with a traceback: one line instead."""
        subcommand = self.config.get("subcommand")
        trainer = (self.config[subcommand] if subcommand else self.config).get("trainer") or {}
        max_steps = trainer.get("max_steps")
        if max_steps is not None and max_steps < -1:
            raise ConfigError(f"--trainer.max_steps must be >= 0, or -1 for no limit; got {max_steps}.")

    def after_fit(self) -> None:
        """A run stopped by SIGTERM / SIGINT exits with status 128 + signal, after saying where it stopped."""
        stopped = [cb.stop_signal for cb in self.trainer.checkpoint_callbacks if getattr(cb, "stop_signal", None)]
        if stopped:
            signum = stopped[0]
            if self.trainer.is_global_zero:
                print(
                    f"gridtnp: stopped by {signal.Signals(signum).name} after step {self.trainer.global_step}; "
                    "last.ckpt written. Rerun the same command to resume.",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(128 + signum)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads an explicit --ckpt_path's hyperparameters while parsing: check the file first, so that
        # a truncated or corrupt one is an error naming it rather than a zip-reader traceback.
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else None
        ckpt_path = config.get("ckpt_path") if config else None
        if ckpt_path is None and subcommand in ("test", "predict") and not config.get("allow_untrained"):
            raise ConfigError(
                f"gridtnp {subcommand} needs --ckpt_path CHECKPOINT: without one it would score the model's "
                "untrained initial weights (pass --allow_untrained true to do that on purpose)."
            )
        if ckpt_path == "best" and subcommand in ("validate", "test", "predict"):
            ckpt_path = config["ckpt_path"] = self._best_checkpoint(config)
        special = ckpt_path in (None, "last", "best", "hpc") or str(ckpt_path).startswith("registry")
        if not special and not is_url(ckpt_path):
            if not os.path.isfile(ckpt_path):
                raise ConfigError(f"--ckpt_path {ckpt_path}: no such file.")
            resume_checkpoint(ckpt_path, [], None)  # a truncated or corrupt file is an error naming it
            check_checkpoint_model(ckpt_path, config.get("model"))
        super()._parse_ckpt_path()

    @staticmethod
    def _best_checkpoint(config: Any) -> str:
        """``--ckpt_path best`` outside ``fit``: the best checkpoint recorded in ``--checkpoint.dirpath``."""
        dirpath = (config.get("checkpoint") or {}).get("dirpath")
        if not dirpath:
            raise ConfigError(
                "--ckpt_path best needs --checkpoint.dirpath DIR, the directory `gridtnp fit` wrote its checkpoints to."
            )
        path, monitor, score = best_checkpoint(dirpath)
        if rank_zero_only.rank == 0:
            value = "" if score is None else f" ({monitor} {score:.4f})"
            print(f"gridtnp: best checkpoint: {path}{value}", flush=True)
        return str(path)

    def before_predict(self) -> None:
        """Tell the prediction writer which recipe produced the run (recorded in the file's attributes)."""
        from gridtnp.predictions import PredictionWriter

        configs = [str(c) for c in self.config[self.subcommand].get("config") or []]
        for callback in self.trainer.callbacks:
            if isinstance(callback, PredictionWriter):
                callback.recipe = configs

    def test(self, **kwargs: Any) -> Any:
        """``trainer.test`` without Lightning's own results table: ``after_test`` prints gridtnp's."""
        return self.trainer.test(**{**kwargs, "verbose": False})

    def after_test(self) -> None:
        """Print the test metrics as a table and write them to JSON next to the checkpoint (rank 0)."""
        metrics = {
            name.removeprefix("test/"): float(value)
            for name, value in self.trainer.callback_metrics.items()
            if name.startswith("test/")
        }
        if not self.trainer.is_global_zero or not metrics:
            return
        path = metrics_path(self.trainer.ckpt_path, self.trainer.log_dir or self.trainer.default_root_dir, "test")
        configs = self.config[self.subcommand].get("config") or []
        record = {
            "split": "test",
            "checkpoint": None if self.trainer.ckpt_path is None else str(self.trainer.ckpt_path),
            "config": [str(c) for c in configs],
            "metrics": metrics,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(format_metrics(metrics, "test"))
        print(f"gridtnp: test metrics written to {path}")


def trainer_defaults() -> dict[str, Any]:
    """Gradient clipping 0.5, bf16-mixed on CUDA and 32-bit elsewhere, runs under ``runs/``; the progress bar only
    on a terminal (a log file gets ``ProgressLog``'s plain lines instead of every bar refresh)."""
    return {
        "gradient_clip_val": 0.5,
        "precision": "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true",
        "default_root_dir": "runs",
        "enable_progress_bar": sys.stdout.isatty(),
    }


def run_lightning(args: list[str] | None = None) -> None:
    """Run a LightningCLI subcommand (``fit``, ``validate``, ``test``, ``predict``); ``None`` reads ``sys.argv``."""
    GridTNPCLI(args=args)


def list_components(args: list[str]) -> None:
    """``gridtnp list [KIND [NAME]] [--params]``: the registry, one component a line, or one component in full."""
    parser = argparse.ArgumentParser(
        prog="gridtnp list",
        description="List registered components; with KIND and NAME, show one component's description and arguments.",
    )
    parser.add_argument("kind", nargs="?", choices=list(KINDS), help="only this kind")
    parser.add_argument("name", nargs="?", help="one component of KIND: its docstring and arguments")
    parser.add_argument("--params", action="store_true", help="build each model preset and count its parameters")
    opts = parser.parse_args(args)
    if opts.name is not None:
        print(document(opts.kind, opts.name))
        return
    kinds = [opts.kind] if opts.kind else list(KINDS)
    for kind in kinds:
        print(f"{kind}: {KINDS[kind]}")
        for name in available(kind):
            extra = ""
            if opts.params and kind == "model":
                from gridtnp.models import count_parameters, create_model

                extra = f"  [{count_parameters(create_model(name)):,} parameters]"
            print(f"  {name:<24} {describe(kind, name)}{extra}")
    if opts.kind:
        print(f"\n`gridtnp list {opts.kind} NAME` shows one {opts.kind}'s arguments.")


def _evaluation_parser(prog: str, description: str, out_help: str) -> argparse.ArgumentParser:
    """The options ``gridtnp plot`` and ``gridtnp report`` share."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, action="append", help="the recipe the checkpoint was trained with")
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
    config_args = [a for c in config for a in ("--config", c)]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when sys.argv has arguments besides ``args``
    try:
        cli = GridTNPCLI(run=False, args=[*config_args, *rest, "--trainer.logger", "false"])
    finally:
        sys.argv = argv
    check_checkpoint_model(ckpt_path, cli.config.get("model"))
    module = cli.model
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    if hasattr(module, "on_load_checkpoint"):
        module.on_load_checkpoint(checkpoint)  # the data's statistics, the variance calibration's buffers
    module.load_state_dict(checkpoint["state_dict"])
    module.eval()
    return cli


def plot_main(args: list[str]) -> None:
    """``gridtnp plot --config RECIPE --ckpt_path CKPT --out DIR [--split val|test] [--num_tasks N]``: PNG files.

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
    parser.add_argument("--num_tasks", type=int, default=4, help="tasks to draw (default 4)")
    opts, rest = parser.parse_known_args(args)
    if opts.num_tasks < 1:
        parser.error(f"--num_tasks must be >= 1; got {opts.num_tasks}")
    if not opts.ckpt_path.is_file():
        parser.error(f"--ckpt_path {opts.ckpt_path}: no such file")
    check_output(opts.out, "plot folder", "--overwrite", opts.overwrite, is_plot_folder)
    from gridtnp.evaluation import run_split  # matplotlib only loads for this subcommand and the callback
    from gridtnp.plots import split_figures

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
    """``gridtnp report --config RECIPE --ckpt_path CKPT --out report.html``: one self-contained HTML page."""
    parser = _evaluation_parser(
        "gridtnp report",
        "Evaluate a checkpoint on the test (or validation) split and write one self-contained HTML page: the metric "
        "table (all / context / held-out targets, calibrated and not, the baselines beside), maps, calibration and "
        "per-station figures (embedded, no network needed to view it), the recipe and the checkpoint. "
        "Other --model.* / --data.* arguments override the recipe as in `gridtnp test`.",
        "the HTML file to write",
    )
    parser.add_argument("--num_tasks", type=int, default=2, help="tasks drawn as maps (default 2)")
    opts, rest = parser.parse_known_args(args)
    if opts.num_tasks < 1:
        parser.error(f"--num_tasks must be >= 1; got {opts.num_tasks}")
    if not opts.ckpt_path.is_file():
        parser.error(f"--ckpt_path {opts.ckpt_path}: no such file")
    if opts.out.suffix.lower() not in (".html", ".htm"):
        parser.error(f"--out {opts.out}: expected an .html file name")
    from gridtnp.cli.html_report import is_report, write_report

    check_output(opts.out, "report", "--overwrite", opts.overwrite, is_report)
    geographic = None if opts.geographic == "auto" else opts.geographic == "yes"
    with quiet_lightning_info():
        cli = load_checkpoint(opts.config, opts.ckpt_path, rest)
        path = write_report(cli, opts.ckpt_path, opts.config, opts.out, opts.split, opts.num_tasks, geographic)
    print(f"gridtnp report: written to {path}")


SUBCOMMANDS = {
    "fit": "train a model from a recipe (resumes from checkpoints in --checkpoint.dirpath)",
    "validate": "evaluate a checkpoint on the validation set",
    "test": "evaluate a checkpoint on the test set: metric table and <checkpoint>.test_metrics.json",
    "predict": "write a checkpoint's predictions as NetCDF or Zarr (--predictions.path)",
    "list": "the registry: gridtnp list [KIND [NAME]] [--params]",
    "plot": "PNG plots of a checkpoint's predictions: gridtnp plot --config R --ckpt_path C --out DIR",
    "report": "one HTML page of a checkpoint's evaluation: gridtnp report --config R --ckpt_path C --out F.html",
    "data": "gridtnp data prepare: NetCDF / GRIB -> a Zarr store for the ERA5 DataModules",
}


def usage() -> str:
    """``gridtnp --help``: every subcommand with one line each."""
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: gridtnp SUBCOMMAND [options]   (gridtnp SUBCOMMAND --help for its options)", "", "subcommands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in SUBCOMMANDS.items()]
    lines += ["", "  --version  print the version and exit", "  --verbose  keep third-party warnings gridtnp filters"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridtnp`` console script."""
    import gridtnp

    args = sys.argv[1:] if argv is None else list(argv)
    if "--verbose" in args:
        args.remove("--verbose")
    else:
        quiet_third_party(args[0] if args else None)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return
    if args[0] == "--version":
        print(f"gridtnp {gridtnp.__version__}")
        return
    try:
        if args[0] not in SUBCOMMANDS and not args[0].startswith("-"):
            close = difflib.get_close_matches(args[0], SUBCOMMANDS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown subcommand {args[0]!r}.{hint} Subcommands: {', '.join(SUBCOMMANDS)}.")
        if args[0] == "list":
            list_components(args[1:])
        elif args and args[0] == "plot":
            plot_main(args[1:])
        elif args and args[0] == "report":
            report_main(args[1:])
        elif args and args[0] == "data":
            from gridtnp.data.prepare import data_main  # xarray and dask only load for this subcommand

            data_main(args[1:])
        else:
            if argv is None:  # LightningCLI reads sys.argv itself (and warns if given both)
                sys.argv = [sys.argv[0], *args]
            run_lightning(None if argv is None else args)
    except argparse.ArgumentError as err:
        print(f"gridtnp: error: {argument_error_line(err, args)}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        # jsonargparse re-raises errors from a model's __init__ wrapped in its own ValueError:
        # report the ConfigError underneath (it says what to fix) instead of a traceback.
        config_error = find_config_error(err)
        if config_error is None:
            raise
        print(f"gridtnp: error: {config_error}", file=sys.stderr)
        raise SystemExit(2) from None
