"""What ``gridtnp fit`` tells a person: what it is doing at start, one line per validation in the data's units, the
checkpoints and next commands at the end, and what a signal saved.

* ``RunSummary``: the callback printing the start-up and validation lines (rank 0), keeping them by step.
* ``validation_line(metrics, units)``: ``step 400: held-out RMSE 0.41 K (coarse cell 0.92 K), 90 % coverage 0.88``.
* ``fit_summary(trainer, argv)``, ``stop_line(trainer, argv, signum)``: the last lines of a finished or stopped fit.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L

from gridtnp.training.checkpoint_files import checkpoint_step
from gridtnp.training.config_saving import CONFIG_NAME


def _first(metrics: dict[str, float], *names: str) -> tuple[str, float] | None:
    """The first of ``names`` that ``metrics`` holds, with its value."""
    for name in names:
        if name in metrics:
            return name, float(metrics[name])
    return None


def validation_line(metrics: dict[str, Any], units: str | None) -> str:
    """One line of a validation's ``val/*`` metrics: the held-out (else all-target) RMSE in physical units beside the
    coarse-cell baseline where the data provide them, else in normalised units; 90 % coverage; log-likelihood."""
    metrics = {k: float(v) for k, v in metrics.items()}
    unit = f" {units}" if units else ""
    parts = []
    rmse = _first(metrics, "val/heldout/rmse_physical", "val/rmse_physical")
    if rmse is not None:
        where = "held-out " if rmse[0].startswith("val/heldout/") else ""
        text = f"{where}RMSE {rmse[1]:.3g}{unit}"
        group = "val/heldout/" if where else "val/"
        baseline = metrics.get(f"{group}baseline_rmse_physical")
        if baseline is not None:
            text += f" (coarse cell {baseline:.3g}{unit})"
        parts.append(text)
    else:
        normalised = _first(metrics, "val/heldout/rmse", "val/rmse")
        if normalised is not None:
            where = "held-out " if normalised[0].startswith("val/heldout/") else ""
            parts.append(f"{where}RMSE {normalised[1]:.3g} (normalised units)")
    coverage = _first(metrics, "val/heldout/coverage_90", "val/coverage_90")
    if coverage is not None:
        parts.append(f"90 % coverage {coverage[1]:.2f}")
    if "val/loglik" in metrics:
        parts.append(f"log-likelihood {metrics['val/loglik']:.3f}")
    return ", ".join(parts)


def target_units(trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
    """The units of the (first) target variable, from the DataModule's or the checkpoint's data description."""
    describe = getattr(trainer.datamodule, "variable_metadata", None)
    metadata = describe() if callable(describe) else None
    metadata = metadata or getattr(pl_module, "data_metadata", None) or {}
    targets, variables = metadata.get("target") or [], metadata.get("variables") or {}
    units = (variables.get(targets[0]) or {}).get("units") if targets else None
    return {"K": "K", "kelvin": "K", "degK": "K"}.get(units, units) or None


class RunSummary(L.Callback):
    """Rank 0 prints what the run is doing before its first step, and one line per validation (``validation_line``),
    kept in ``lines`` by global step for the end-of-fit summary."""

    def __init__(self) -> None:
        self.lines: dict[int, str] = {}
        self.units: str | None = None
        self.start = 0.0
        self._first_step_said = False

    @staticmethod
    def _say(trainer: L.Trainer, text: str) -> None:
        if trainer.is_global_zero:
            print(f"gridtnp: {text}", flush=True)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        n = trainer.num_sanity_val_steps
        self._say(trainer, f"checking the validation step on {n} batch{'es' if n != 1 else ''} before training ...")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.units = target_units(trainer, pl_module)
        self.start = time.monotonic()
        compiling = ", compiling the model" if getattr(pl_module, "compiled", None) is not None else ""
        self._say(trainer, f"training from step {trainer.global_step}: starting the data loaders{compiling} ...")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        if not self._first_step_said:
            self._first_step_said = True
            if trainer.progress_bar_callback is None:  # the bar shows it; a line would break the bar
                self._say(trainer, f"first step done in {time.monotonic() - self.start:.1f} s")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        line = validation_line({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}, self.units)
        if line:
            self.lines[trainer.global_step] = line
            if trainer.is_global_zero:
                newline = "\n" if trainer.progress_bar_callback is not None else ""  # not glued to the bar
                print(f"{newline}gridtnp: step {trainer.global_step}: {line}", flush=True)


def shown(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when it lies below it (as a person would type it)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def resume_command(argv: list[str], ckpt: str | os.PathLike) -> str:
    """The command line ``argv`` (``fit ...``) with ``--ckpt_path`` set to ``ckpt``."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--ckpt_path":
            skip = True
            continue
        if not arg.startswith("--ckpt_path="):
            args.append(arg)
    return "gridtnp " + shlex.join([*(args or ["fit"]), "--ckpt_path", shown(ckpt)])


def _last_path(trainer: L.Trainer) -> Path | None:
    callback = trainer.checkpoint_callback
    dirpath = getattr(callback, "dirpath", None)
    return Path(dirpath) / "last.ckpt" if dirpath else None


def stop_line(trainer: L.Trainer, argv: list[str], signum: int | None) -> str:
    """What a stopped fit saved and how to go on; ``signum`` None: a second Ctrl-C that did not wait."""
    last = _last_path(trainer)
    saved = last is not None and last.is_file()
    step = checkpoint_step(last) if saved else None
    newline = "\n" if trainer.progress_bar_callback is not None else ""
    if signum is None:
        head = f"{newline}gridtnp: stopped by a second SIGINT during step {trainer.global_step + 1}, without waiting"
        kept = f"kept {shown(last)} (step {step})" if saved else "no checkpoint was saved yet"
        tail = f"; resume with: {resume_command(argv, last)}" if saved else ""
        return f"{head}; {kept}{tail}"
    head = f"{newline}gridtnp: stopped by {signal.Signals(signum).name} after step {trainer.global_step}"
    if not saved:
        return f"{head}; no checkpoint could be written (see the errors above)"
    requeued = getattr(trainer.checkpoint_callback, "requeued", None)
    if requeued:
        return f"{head}; saved {shown(last)}; {requeued}: it resumes from there"
    return f"{head}; saved {shown(last)}; resume with: {resume_command(argv, last)}"


def fit_summary(trainer: L.Trainer, argv: list[str]) -> str:
    """The end of a finished fit: the last and best checkpoints, the best validation's line, the next commands."""
    callback = trainer.checkpoint_callback
    last = _last_path(trainer)
    summary = next((c for c in trainer.callbacks if isinstance(c, RunSummary)), None)
    lines = [f"gridtnp: fit done at step {trainer.global_step}"]
    if last is not None and last.is_file():
        lines.append(f"  last checkpoint: {shown(last)}")
    best = getattr(callback, "best_model_path", "") or ""
    chosen = Path(best) if best and Path(best).is_file() else last
    if best and Path(best).is_file():
        step = checkpoint_step(best)
        score = getattr(callback, "best_model_score", None)
        monitored = f"{callback.monitor} {float(score):.4f}" if score is not None else str(callback.monitor)
        lines.append(f"  best checkpoint: {shown(best)} (step {step}, {monitored})")
        line = summary.lines.get(step) if summary is not None and step is not None else None
        if line:
            lines.append(f"  best validation: {line}")
    elif summary is not None and summary.lines:
        step = max(summary.lines)
        lines.append(f"  last validation (step {step}): {summary.lines[step]}")
    else:
        lines.append("  no validation ran: no best checkpoint")
    if chosen is None or not chosen.is_file():
        return "\n".join(lines)
    config = chosen.parent / CONFIG_NAME
    recipe = ["--config", shown(config)] if config.is_file() else _config_args(argv)
    lines.append(f"  test it:   gridtnp {shlex.join(['test', *recipe, '--ckpt_path', shown(chosen)])}")
    report = ["report", *recipe, "--ckpt_path", shown(chosen), "--out", "report.html"]
    lines.append(f"  report it: gridtnp {shlex.join(report)}")
    return "\n".join(lines)


def _config_args(argv: list[str]) -> list[str]:
    """The ``--config FILE`` pairs of a command line."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            out += [arg, argv[i + 1]]
        elif arg.startswith("--config="):
            out.append(arg)
    return out
