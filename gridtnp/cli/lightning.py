"""``gridtnp fit | validate | test | predict``: gridtnp's ``LightningCLI`` with its defaults, guards and outputs.

* ``GridTNPCLI``: the recipe's model and DataModule, gridtnp's checkpoint, progress, plot and prediction callbacks,
  the guards of ``gridtnp.cli.guards`` before anything runs, the test metric table and file after ``test``.
* ``trainer_defaults()``: gradient clipping, bf16 on CUDA, runs under ``runs/``; ``run_lightning(args)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
from typing import Any

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from gridtnp.cli.class_paths import guarded_imports
from gridtnp.cli.guards import (
    check_checkpoint_model,
    check_trainer_options,
    command_line_model_keys,
    count_limits,
)
from gridtnp.cli.reports import ProgressLog, format_metrics, metrics_path, versioned_path
from gridtnp.files import is_url
from gridtnp.locks import claim_version, lock_directory, unlock_directory
from gridtnp.redaction import redact, redact_url
from gridtnp.registry import ConfigError
from gridtnp.training.checkpointing import (
    LOGGER_VERSION,
    Checkpoint,
    CheckpointError,
    SaveConfig,
    best_checkpoint,
    checkpoint_entry,
    checkpoint_step,
    resume_checkpoint,
    unusable_reason,
)


class GridTNPCLI(LightningCLI):
    """LightningCLI for any ``NeuralProcessModule`` and ``LightningDataModule`` (``class_path`` in the recipe),
    with gridtnp's trainer defaults, a best/last checkpoint callback (``--checkpoint.*``), prediction plots logged to
    TensorBoard (``--plots.*``, ``gridtnp.report.plots.PlotCallback``), a prediction writer (``--predictions.*``), the
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
        # Raise instead of printing the usage text first: main() turns the error into one line with a hint. Recipes
        # may name their DataModule by registry name (gridtnp.cli.recipe_names).
        from gridtnp.cli.recipe_names import RECIPE_MODE

        # allow_abbrev False: `--trainer.max_step 30` is an error naming max_steps, not silently max_steps.
        no_exit = {"exit_on_error": False, "parser_mode": RECIPE_MODE, "allow_abbrev": False}
        kwargs.setdefault(
            "parser_kwargs", {**no_exit, **{sub: no_exit for sub in ("fit", "validate", "test", "predict")}}
        )
        with guarded_imports():  # a recipe's class_path imports only allowed modules (gridtnp.cli.class_paths)
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
        from gridtnp.inference.predictions import PredictionWriter
        from gridtnp.report.plots import PlotCallback

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
                "checkpoint.save_last": True,
                "checkpoint.last_every_n_steps": 1000,
            }
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as LightningCLI does; ``--print_config`` prints the config with the model's components expanded
        (preset resolved, every argument of every slot with the value the model builds it with) and exits."""
        argv = None if isinstance(args, dict | Namespace) else list(sys.argv[1:] if args is None else args)
        self.argv = argv or []
        if argv is None or not any(a == "--print_config" or a.startswith("--print_config=") for a in argv):
            super().parse_arguments(parser, args)
            return
        self.config = parser.parse_args([a for a in argv if not a.startswith("--print_config")])
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        init_args = config.get("model", {}).get("init_args")
        from gridtnp.models.specs import MODEL_KEYS, SLOTS, expand_spec

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
        if ckpt_path not in (None, "last") and os.path.isfile(ckpt_path):
            # Before anything is written (config.yaml, logs): a recipe that changed the network is one line.
            check_checkpoint_model(ckpt_path, self.config[self.subcommand].get("model"))
        config["ckpt_path"] = ckpt_path
        version = checkpoint_entry(ckpt_path, LOGGER_VERSION) if ckpt_path not in (None, "last") else None
        logger = self.trainer.logger
        if version is not None and isinstance(logger, TensorBoardLogger) and logger.version != version:
            # Continue the run's TensorBoard folder instead of starting version_N+1 (one continuous curve).
            self.trainer.loggers = [
                redacting(TensorBoardLogger(save_dir=logger.save_dir, name=logger.name, version=version))
            ]
        for callback in self.trainer.checkpoint_callbacks:
            if hasattr(callback, "follow_metric"):  # a mode against the metric: refused before a folder is made
                callback.follow_metric(self.model)
        if rank_zero:
            self.locks = [lock_directory(d) for d in explicit_dirs or [self._default_checkpoint_dir()]]
            print("gridtnp: setting up the data and the devices ...", flush=True)

    def _default_checkpoint_dir(self) -> str:
        """The folder Lightning writes checkpoints to without ``--checkpoint.dirpath`` (``<logger folder>/version_N/
        checkpoints``), the logger's new version claimed atomically: two fits started together never share one."""
        logger, root = self.trainer.logger, self.trainer.default_root_dir
        if logger is None:
            return os.path.join(root, "checkpoints")
        if getattr(logger, "_version", 0) is None and getattr(logger, "root_dir", None):
            logger._version = claim_version(logger.root_dir)  # the version Lightning would pick, made atomically
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        return os.path.join(logger.save_dir or root, str(logger.name), version, "checkpoints")

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        subcommand = self.config_init.get("subcommand")
        count_limits((self.config_init[subcommand] if subcommand else self.config_init)["trainer"], self.argv)
        trainer = super().instantiate_trainer(**kwargs)
        for logger in trainer.loggers:
            redacting(logger)
        if subcommand == "fit":
            from gridtnp.training.summary import RunSummary

            trainer.callbacks.insert(0, RunSummary())  # start-up and validation lines, the end-of-fit summary
            bars = [i for i, c in enumerate(trainer.callbacks) if type(c) is TQDMProgressBar]
            if bars:  # Lightning's default bar: one that keeps its total and ETA after a resume
                from gridtnp.training.progress import ResumingProgressBar

                trainer.callbacks[bars[0]] = ResumingProgressBar()
        return trainer

    def before_instantiate_classes(self) -> None:
        """Trainer and checkpoint values Lightning would reject with a traceback (or take silently): one line."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        check_trainer_options(config)
        if subcommand == "fit" and rank_zero_only.rank == 0:
            print("gridtnp: building the model and the DataModule ...", flush=True)

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:
            for lock in getattr(self, "locks", []):
                unlock_directory(lock)
            if getattr(self, "download_dir", None):
                shutil.rmtree(self.download_dir, ignore_errors=True)

    def fit(self, **kwargs: Any) -> None:
        """``trainer.fit``; a second Ctrl-C (``HardStop``) ends it at once with a line saying what was saved."""
        from gridtnp.training.signals import HardStop
        from gridtnp.training.summary import stop_line

        try:
            self.trainer.fit(**kwargs)
        except HardStop:
            if self.trainer.is_global_zero:
                print(stop_line(self.trainer, getattr(self, "argv", []), None), file=sys.stderr, flush=True)
            launcher = self.trainer.strategy.launcher
            if launcher is not None and hasattr(launcher, "kill"):
                launcher.kill(signal.SIGKILL)  # ranks started by this process (they would wait for it)
            raise SystemExit(128 + signal.SIGINT) from None

    def after_fit(self) -> None:
        """A run stopped by a signal exits with status 128 + signal after saying what it saved; a finished run
        prints its checkpoints, best validation and the commands to test or report it."""
        from gridtnp.training.summary import fit_summary, stop_line

        stopped = [cb for cb in self.trainer.checkpoint_callbacks if getattr(cb, "stop_signal", None)]
        if stopped:
            signum = stopped[0].stop_signal
            if self.trainer.is_global_zero and not getattr(stopped[0], "stop_reported", False):
                print(stop_line(self.trainer, getattr(self, "argv", []), signum), file=sys.stderr, flush=True)
            raise SystemExit(128 + signum)
        if self.trainer.is_global_zero:
            print(fit_summary(self.trainer, getattr(self, "argv", [])), flush=True)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads an explicit --ckpt_path's hyperparameters while parsing: check the file first, so that
        # a truncated or corrupt one is an error naming it rather than a zip-reader traceback.
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else None
        ckpt_path = config.get("ckpt_path") if config else None
        evaluating = subcommand in ("validate", "test", "predict")
        if evaluating and ckpt_path == "hpc":
            raise ConfigError(
                f"--ckpt_path hpc only resumes `gridtnp fit` under SLURM; give gridtnp {subcommand} a checkpoint file, "
                "'best' or 'last' (with --checkpoint.dirpath)."
            )
        if evaluating and ckpt_path == "last":
            dirpath = (config.get("checkpoint") or {}).get("dirpath")
            root = (config.get("trainer") or {}).get("default_root_dir")
            found = resume_checkpoint("last", [dirpath] if dirpath else [], root)
            ckpt_path = config["ckpt_path"] = None if found is None else str(found)
            if ckpt_path is not None and rank_zero_only.rank == 0:
                print(f"gridtnp: last checkpoint: {ckpt_path}", flush=True)
        if ckpt_path is None and evaluating and not config.get("allow_untrained"):
            found = " (--ckpt_path last found no checkpoint)" if config.get("ckpt_path") is None else ""
            raise ConfigError(
                f"gridtnp {subcommand} needs --ckpt_path CHECKPOINT{found}: without one it would score the model's "
                "untrained initial weights (pass --allow_untrained true to do that on purpose)."
            )
        if ckpt_path == "best" and evaluating:
            ckpt_path = config["ckpt_path"] = self._best_checkpoint(config)
        special = ckpt_path in (None, "last", "best", "hpc") or str(ckpt_path).startswith("registry")
        given: dict[str, Any] = {}
        if not special and is_url(ckpt_path):
            ckpt_path = config["ckpt_path"] = self._local_checkpoint(str(ckpt_path))
        if not special:
            if not os.path.isfile(ckpt_path):
                raise ConfigError(f"--ckpt_path {ckpt_path}: no such file.")
            resume_checkpoint(ckpt_path, [], None)  # a truncated, corrupt or unsafe file is an error naming it
            check_checkpoint_model(ckpt_path, config.get("model"))
            init_args = (config.get("model") or {}).get("init_args")
            if evaluating and init_args is not None:
                given = {k: init_args[k] for k in command_line_model_keys(getattr(self, "argv", [])) if k in init_args}
        super()._parse_ckpt_path()
        if given:
            # LightningCLI replaced the model arguments by the checkpoint's; the ones given on the command line
            # (e.g. cos_latitude_weighting at test time) apply, as the README says.
            init_args = self.config[subcommand]["model"]["init_args"]
            for key, value in given.items():
                init_args[key] = value

    def _local_checkpoint(self, address: str) -> str:
        """``--ckpt_path file://...`` as its path; a remote address downloaded into a temporary folder (removed when
        the command ends), so that only the checked local copy is ever loaded."""
        import tempfile

        from gridtnp.training.checkpoint_loading import local_checkpoint

        if address.startswith("file://"):
            return str(local_checkpoint(address, "."))
        self.download_dir = tempfile.mkdtemp(prefix="gridtnp-checkpoint-")
        self.ckpt_address = redact_url(address)
        try:
            local = local_checkpoint(address, self.download_dir)
            reason = unusable_reason(local)  # named by its address, not by the temporary copy
            if reason is not None:
                raise CheckpointError(f"checkpoint {self.ckpt_address} is {reason}.")
        except BaseException:
            shutil.rmtree(self.download_dir, ignore_errors=True)
            raise
        return str(local)

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
        """Tell the prediction writer which recipe produced the run (recorded in the file's attributes), and keep
        Lightning from holding every batch's outputs (``--return_predictions true`` to keep them)."""
        from gridtnp.inference.predictions import PredictionWriter

        configs = [str(c) for c in self.config[self.subcommand].get("config") or []]
        for callback in self.trainer.callbacks:
            if isinstance(callback, PredictionWriter):
                callback.recipe = configs
        # The writer keeps what it writes; Lightning would also keep every batch's outputs until the end.
        config = self.config_init[self.subcommand]
        if config.get("return_predictions") is None:
            config["return_predictions"] = False

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
        downloaded = getattr(self, "ckpt_address", None)  # its temporary copy goes: the metrics go to the log folder
        ckpt = None if downloaded else self.trainer.ckpt_path
        path = metrics_path(ckpt, self.trainer.log_dir or self.trainer.default_root_dir, "test")
        config = self.config[self.subcommand]
        configs = config.get("config") or []
        settings = json.dumps(redact(config.as_dict()), sort_keys=True, default=str)
        record = {
            "split": "test",
            "checkpoint": downloaded or (None if self.trainer.ckpt_path is None else str(self.trainer.ckpt_path)),
            "config": [str(c) for c in configs],
            "settings_digest": hashlib.sha256(settings.encode()).hexdigest()[:16],
            "metrics": metrics,
        }
        path = versioned_path(path, record["settings_digest"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(format_metrics(metrics, "test"))
        print(f"gridtnp: test metrics written to {path}")


def redacting(logger: Any) -> Any:
    """``logger`` with credentials replaced in the hyper-parameters it records (``hparams.yaml``)."""
    log_hyperparams = logger.log_hyperparams

    def log_redacted(params: Any, *args: Any, **kwargs: Any) -> Any:
        return log_hyperparams(redact(params), *args, **kwargs)

    logger.log_hyperparams = log_redacted
    return logger


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
    """Run a LightningCLI subcommand (``fit``, ``validate``, ``test``, ``predict``); ``None`` reads ``sys.argv``.

    Given ``args`` (``gridtnp.cli.main([...])`` from Python: a notebook, a test), they are the whole command line:
    the process's own ``sys.argv`` (a kernel's or pytest's options) is set aside while it runs.
    """
    if args is None:
        GridTNPCLI(args=None)
        return
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        GridTNPCLI(args=args)
    finally:
        sys.argv = argv
