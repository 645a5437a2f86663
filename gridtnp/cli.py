"""``gridtnp``: ``fit | validate | test | predict`` through LightningCLI, ``list`` for the registry, ``data prepare``,
``plot`` for PNG figures of a checkpoint's predictions.

gridtnp fit --config recipes/gp1d_tnp.yaml --trainer.max_steps 300
gridtnp plot --config recipes/gp1d_tnp.yaml --ckpt_path runs/.../last.ckpt --out plots/
gridtnp list processor
gridtnp list model --params
gridtnp data prepare era5.nc --out era5.zarr --train-start 2019-03-01 --train-end 2019-03-21
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from gridtnp.registry import KINDS, ConfigError, available, describe


class Checkpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` always holds the latest weights.

    With a monitored metric, Lightning rewrites ``last.ckpt`` only when a new best is saved, so after a
    validation loss that got worse "last" would silently be an older model. Here it is rewritten after every
    validation and at the end of training (``trainer.save_checkpoint`` is collective; rank 0 writes).
    """

    def _write_last(self, trainer: L.Trainer) -> None:
        if self.save_last and self.dirpath and not trainer.sanity_checking:
            path = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
            self.last_model_path = path  # so Lightning's own "last" save overwrites it instead of adding last-v1
            trainer.save_checkpoint(path)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._write_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._write_last(trainer)


class GridTNPCLI(LightningCLI):
    """LightningCLI for any ``NeuralProcessModule`` and ``LightningDataModule`` (``class_path`` in the recipe),
    with gridtnp's trainer defaults, a best/last checkpoint callback (``--checkpoint.*``), prediction plots logged to
    TensorBoard (``--plots.*``, ``gridtnp.plots.PlotCallback``), the parameter count printed, and the test metrics
    printed as a table and written to JSON."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        from gridtnp.module import NeuralProcessModule

        kwargs.setdefault("trainer_defaults", trainer_defaults())
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
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
        parser.set_defaults(
            {"checkpoint.monitor": "val/loglik", "checkpoint.mode": "max", "checkpoint.save_last": True}
        )

    def before_fit(self) -> None:
        n = getattr(self.model, "num_parameters", None)
        if n is not None and self.trainer.is_global_zero:
            print(f"gridtnp: {type(self.model).__name__} with {n:,} trainable parameters")

    def before_predict(self) -> None:
        """Tell the prediction writer which recipe produced the run (recorded in the file's attributes)."""
        from gridtnp.predictions import PredictionWriter

        configs = [str(c) for c in self.config[self.subcommand].get("config") or []]
        for callback in self.trainer.callbacks:
            if isinstance(callback, PredictionWriter):
                callback.recipe = configs

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


def metrics_path(ckpt_path: str | os.PathLike | None, fallback_dir: str | os.PathLike, split: str) -> Path:
    """Where ``gridtnp test`` writes its metrics: ``<checkpoint stem>.<split>_metrics.json`` beside the checkpoint,
    or ``<fallback_dir>/<split>_metrics.json`` when the model was not loaded from one."""
    if ckpt_path:
        ckpt = Path(ckpt_path)
        return ckpt.with_name(f"{ckpt.stem}.{split}_metrics.json")
    return Path(fallback_dir) / f"{split}_metrics.json"


def format_metrics(metrics: dict[str, float], split: str) -> str:
    """A plain-text table of ``{name: value}``, the log-likelihood with its standard error over tasks."""
    rows = []
    for name, value in metrics.items():
        if name == "loglik_stderr":
            continue
        text = f"{value:.4f}"
        if name == "loglik" and "loglik_stderr" in metrics:
            text += f" +- {metrics['loglik_stderr']:.4f} (standard error over tasks)"
        rows.append((f"{split}/{name}", text))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 5}"]
    lines += [f"{name:<{width}}  {text}" for name, text in rows]
    return "\n".join(lines)


def trainer_defaults() -> dict[str, Any]:
    """Gradient clipping 0.5, bf16-mixed on CUDA and 32-bit elsewhere, runs under ``runs/``."""
    return {
        "gradient_clip_val": 0.5,
        "precision": "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true",
        "default_root_dir": "runs",
    }


def run_lightning(args: list[str] | None = None) -> None:
    """Run a LightningCLI subcommand (``fit``, ``validate``, ``test``, ``predict``); ``None`` reads ``sys.argv``."""
    GridTNPCLI(args=args)


def list_components(args: list[str]) -> None:
    """``gridtnp list [KIND] [--params]``: the registry, one component a line."""
    parser = argparse.ArgumentParser(prog="gridtnp list", description="List registered components.")
    parser.add_argument("kind", nargs="?", choices=list(KINDS), help="only this kind")
    parser.add_argument("--params", action="store_true", help="build each model preset and count its parameters")
    opts = parser.parse_args(args)
    kinds = [opts.kind] if opts.kind else list(KINDS)
    for kind in kinds:
        print(f"{kind}: {KINDS[kind]}")
        for name in available(kind):
            extra = ""
            if opts.params and kind == "model":
                from gridtnp.models import count_parameters, create_model

                extra = f"  [{count_parameters(create_model(name)):,} parameters]"
            print(f"  {name:<24} {describe(kind, name)}{extra}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridtnp`` console script."""
    import gridtnp  # noqa: F401  (registers every component)

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        if args and args[0] == "list":
            list_components(args[1:])
        elif args and args[0] == "plot":
            from gridtnp.plots import plot_main  # matplotlib only loads for this subcommand and the callback

            plot_main(args[1:])
        elif args and args[0] == "data":
            from gridtnp.data.prepare import data_main  # xarray and dask only load for this subcommand

            data_main(args[1:])
        else:
            run_lightning(None if argv is None else args)
    except Exception as err:
        # jsonargparse re-raises errors from a model's __init__ wrapped in its own ValueError:
        # report the ConfigError underneath (it says what to fix) instead of a traceback.
        config_error = _find_config_error(err)
        if config_error is None:
            raise
        print(f"gridtnp: error: {config_error}", file=sys.stderr)
        raise SystemExit(2) from None


def _find_config_error(err: BaseException | None) -> ConfigError | None:
    """The first ``ConfigError`` in an exception's chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ConfigError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


if __name__ == "__main__":
    main()
