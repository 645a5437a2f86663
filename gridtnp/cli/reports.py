"""What the CLI prints and logs: the test metric table and its JSON path, plain progress lines off a terminal, and
the third-party messages it filters.

* ``metrics_path(ckpt, fallback_dir, split)``, ``versioned_path(path, digest)``, ``format_metrics(metrics, split)``:
  ``gridtnp test``'s outputs (a run with other settings writes ``<name>.1.json``, ... beside the first).
* ``ProgressLog``: a callback printing one line every N steps when there is no progress bar.
* ``quiet_third_party(subcommand)``: warnings and log lines a gridtnp user cannot act on, filtered with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L


def metrics_path(ckpt_path: str | os.PathLike | None, fallback_dir: str | os.PathLike, split: str) -> Path:
    """Where ``gridtnp test`` writes its metrics: ``<checkpoint stem>.<split>_metrics.json`` beside the checkpoint,
    or ``<fallback_dir>/<split>_metrics.json`` when the model was not loaded from one."""
    if ckpt_path:
        ckpt = Path(ckpt_path)
        return ckpt.with_name(f"{ckpt.stem}.{split}_metrics.json")
    return Path(fallback_dir) / f"{split}_metrics.json"


def versioned_path(path: Path, digest: str) -> Path:
    """``path``, or when it holds metrics of a run with other settings (``settings_digest``), the first free
    ``<name>.N.json``: a second ``gridtnp test`` with other options never replaces the first's metrics."""
    candidate, n = path, 0
    while candidate.exists():
        try:
            if json.loads(candidate.read_text()).get("settings_digest") == digest:
                return candidate  # the same settings again: replaced
        except (OSError, ValueError, AttributeError):
            pass
        n += 1
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return candidate


def format_metrics(metrics: dict[str, float], split: str) -> str:
    """A plain-text table of ``{name: value}``, the log-likelihood with its standard error over tasks.

    Names with a group prefix (``context/rmse``, ``heldout/rmse``, ``uncalibrated/rmse``,
    ``uncalibrated/context/rmse``) become columns beside the pooled value (``all``), one row per metric.
    """
    groups: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        group, _, metric = name.rpartition("/")
        groups.setdefault(group, {})[metric] = value
    if set(groups) == {""}:
        return _single_column(metrics, split)
    order = ["", "context", "heldout", "uncalibrated", "uncalibrated/context", "uncalibrated/heldout"]
    columns = sorted(groups, key=lambda g: (order.index(g) if g in order else len(order), g))
    names = list(dict.fromkeys(m for g in columns for m in groups[g]))
    titles = [g or "all" for g in columns]
    rows = [[f"{split}/{m}", *(_number(groups[g].get(m)) for g in columns)] for m in names]
    widths = [max(len(r[i]) for r in [["metric", *titles], *rows]) for i in range(len(columns) + 1)]
    lines = ["  ".join(f"{t:<{w}}" for t, w in zip(["metric", *titles], widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(f"{t:<{w}}" for t, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    notes = {"context": "targets that were also in the context", "heldout": "targets not in the context"}
    notes["uncalibrated"] = "before the variance calibration (the model's own std)"
    used = [f"{k}: {v}" for k, v in notes.items() if any(k in g.split("/") for g in columns)]
    return "\n".join(lines + ([f"({'; '.join(used)})"] if used else []))


def _number(value: float | None) -> str:
    """A table cell: "-" where a group has no such metric or no targets (NaN: e.g. no context target)."""
    return "-" if value is None or value != value else f"{value:.4f}"


def _single_column(metrics: dict[str, float], split: str) -> str:
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


class ProgressLog(L.Callback):
    """Without a progress bar (stdout not a terminal), one plain line every ``every_n_steps`` training steps.

    Args:
        every_n_steps: steps between lines; 0 turns them off.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        self.every_n_steps = every_n_steps
        self.start = 0.0
        self.printed = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        step = trainer.global_step
        if trainer.progress_bar_callback is not None or not self.every_n_steps or step % self.every_n_steps:
            return
        if step == 0 or step == self.printed:  # with gradient accumulation, several batches end on one step
            return
        self.printed = step
        if trainer.is_global_zero:
            loss = trainer.callback_metrics.get("train/loss")
            total = f"/{trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
            rate = step / max(time.monotonic() - self.start, 1e-9)
            text = f"gridtnp: step {step}{total}" + (f", train/loss {float(loss):.4f}" if loss is not None else "")
            print(f"{text}, {rate:.2f} steps/s", flush=True)


def quiet_third_party(subcommand: str | None) -> None:
    """Filter messages that say nothing a gridtnp user can act on (``--verbose`` keeps them)."""
    # Lightning's own use of a deprecated torch API, fixed upstream in a later release.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # NeuralProcessModule moves its Batch itself (Batch.to) on purpose, whatever the DataModule.
    warnings.filterwarnings("ignore", message=r".*overridden `transfer_batch_to_device`")
    # The training stream knows its per-rank length by design (data/datamodules.py: TrainTaskStream).
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined")
    # gridtnp writes config.yaml into the checkpoint directory first, and resumes from checkpoints found there
    # (saying so): Lightning's "exists and is not empty" would appear on every run and tell nothing.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # gridtnp's PredictionWriter orders the outputs itself; Lightning's batch indices are not used.
    warnings.filterwarnings("ignore", message=r"Couldn't infer the batch indices fetched from your dataloader")
    if subcommand in ("test", "validate", "predict", "report"):
        # They restore a checkpoint's callback state they never use: where fit wrote its checkpoints does not matter.
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
    # On a machine with Slurm installed, a run outside a job is deliberate (jobs go through recipes/slurm/*.sbatch).
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    # An advertisement for a hosted logger, printed on every run.
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_tips not in logger.filters:
        logger.addFilter(_drop_tips)


def _drop_tips(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith("💡 Tip:")
