"""Fault-tolerant checkpoints: resume resolution, the best checkpoint, and gridtnp's checkpoint callback.

* Atomic writes, the kept previous version and integrity checks: ``gridtnp.training.checkpoint_files`` (imported
  from here too).
* ``resume_checkpoint`` picks the newest readable checkpoint of a run (its checkpoint directories and Lightning's
  SLURM ``hpc_ckpt_*.ckpt``), warning about, naming and skipping every corrupt or truncated file.
* ``Checkpoint`` is gridtnp's ``ModelCheckpoint``: best-by-metric plus a ``last.ckpt`` that always holds the latest
  state, rewritten every ``last_every_n_steps`` steps, at the end of each epoch and after each validation; it also
  stores every rank's RNG states (``gridtnp.training.rng``) and restores them when training resumes, and saves and
  stops (or requeues) on the signals of ``gridtnp.training.signals``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from gridtnp.files import is_url, remove_path
from gridtnp.metrics import monitored_direction
from gridtnp.redaction import redact
from gridtnp.registry import ConfigError
from gridtnp.training.checkpoint_files import (  # noqa: F401 (imported from here)
    PREVIOUS,
    AtomicCheckpointIO,
    CheckpointError,
    checkpoint_entry,
    checkpoint_step,
    previous_path,
    unusable_reason,
    verify_checkpoint,
)
from gridtnp.training.config_saving import CONFIG_NAME, SaveConfig  # noqa: F401 (imported from here)
from gridtnp.training.rng import all_gather_objects, rng_state, set_rng_state
from gridtnp.training.signals import SignalPath, disable_lightning_requeue, requeue_job

LOGGER_VERSION = "gridtnp_logger_version"  # checkpoint entry: the logger version (folder) of the run


def _priority(path: Path) -> int:
    """Tie-break between equally new files: last.ckpt, then SLURM's hpc checkpoints, then the rest."""
    if path.name == "last.ckpt":
        return 3
    if path.name.startswith("hpc_ckpt_"):
        return 2
    return 0 if PREVIOUS in path.name else 1


def checkpoint_candidates(
    checkpoint_dirs: Iterable[str | os.PathLike], hpc_dir: str | os.PathLike | None
) -> list[Path]:
    """Every ``*.ckpt`` in ``checkpoint_dirs`` and ``hpc_ckpt_*.ckpt`` in ``hpc_dir``, newest first."""
    found: set[Path] = set()
    for directory in checkpoint_dirs:
        if directory is not None and Path(directory).is_dir():
            found.update(p for p in Path(directory).glob("*.ckpt") if p.is_file())
    if hpc_dir is not None and Path(hpc_dir).is_dir():
        found.update(p for p in Path(hpc_dir).glob("hpc_ckpt_*.ckpt") if p.is_file())
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, _priority(p)), reverse=True)


def newest_valid_checkpoint(candidates: list[Path]) -> Path | None:
    """The first readable checkpoint of ``candidates`` (newest first); each unreadable one is skipped with a warning.

    Raises ``CheckpointError`` if there are candidates but none is readable (a run must not silently start over).
    """
    skipped: list[str] = []
    for path in candidates:
        reason = unusable_reason(path)
        if reason is None:
            if skipped:
                rank_zero_warn(f"gridtnp: resuming from the previous checkpoint {path} instead of {skipped[0]}.")
            return path
        skipped.append(str(path))
        rank_zero_warn(f"gridtnp: skipping checkpoint {path}: {reason}.")
    if skipped:
        raise CheckpointError(
            f"no readable checkpoint to resume from; every candidate is corrupt, truncated or foreign: {skipped}. "
            "Delete them (or pick a file with --ckpt_path) to start over."
        )
    return None


def resume_checkpoint(
    ckpt_path: str | os.PathLike | None,
    checkpoint_dirs: list[str | os.PathLike],
    root_dir: str | os.PathLike | None,
) -> str | os.PathLike | None:
    """The checkpoint ``fit`` should resume from.

    * ``ckpt_path="last"``: the newest readable checkpoint in ``checkpoint_dirs`` or SLURM's ``hpc_ckpt_*.ckpt`` in
      ``root_dir``; ``None`` (start fresh) if there is none.
    * ``ckpt_path=None``: the same, automatically, when an explicitly configured checkpoint directory (the only ones
      passed in ``checkpoint_dirs``) already holds checkpoints, or under SLURM when ``root_dir`` holds hpc ones.
    * a file: checked, and an error naming it (and the readable alternatives) if it is corrupt or truncated.
    * other special values (``"best"``, ``"hpc"``, ``"registry"``) are left to Lightning.
    """
    if ckpt_path is None or ckpt_path == "last":
        hpc_dir = root_dir if (ckpt_path == "last" or SLURMEnvironment.detect()) else None
        return newest_valid_checkpoint(checkpoint_candidates(checkpoint_dirs, hpc_dir))
    if str(ckpt_path) in ("best", "hpc", "registry") or str(ckpt_path).startswith("registry:"):
        return ckpt_path
    if not is_url(ckpt_path) and os.path.isfile(ckpt_path):
        reason = unusable_reason(ckpt_path)
        if reason is not None:
            directory = Path(ckpt_path).parent
            others = [str(p) for p in checkpoint_candidates([directory], None) if unusable_reason(p) is None]
            hint = f" Readable checkpoints in {directory}: {others}." if others else ""
            raise CheckpointError(f"checkpoint {ckpt_path} is {reason}.{hint}")
    return ckpt_path


def best_checkpoint(dirpath: str | os.PathLike) -> tuple[Path, str, float | None]:
    """The best checkpoint of the run that wrote ``dirpath``: ``(path, monitored metric, its value)``.

    Read from the newest readable checkpoint there (``last.ckpt``), whose checkpoint callback state records the best
    one (``best_model_path``), so a separate ``gridtnp test --ckpt_path best`` finds what ``fit`` selected.
    """
    newest = newest_valid_checkpoint(checkpoint_candidates([dirpath], None))
    if newest is None:
        raise CheckpointError(f"--ckpt_path best: no checkpoint in {dirpath}; train first (gridtnp fit).")
    states = checkpoint_entry(newest, "callbacks") or {}
    for state in states.values():
        best = state.get("best_model_path") if isinstance(state, dict) else None
        if not best:
            continue
        path = Path(best)
        outside = path.is_file() and not _inside(path, dirpath)
        if not path.is_file() or outside:  # the folder was moved since, or a foreign path
            path = Path(dirpath) / path.name
        if not path.is_file() and outside:
            raise CheckpointError(
                f"--ckpt_path best: {newest} names {best} as the best checkpoint, which lies outside {dirpath}; only "
                "checkpoints in the run's folder are read as 'best': copy it there, or pass it as --ckpt_path FILE."
            )
        if not path.is_file():
            raise CheckpointError(
                f"--ckpt_path best: {newest} names {best} as the best checkpoint, which is gone (not in {dirpath} "
                "either); use --ckpt_path last or a checkpoint file."
            )
        score = state.get("best_model_score")
        return path, str(state.get("monitor")), None if score is None else float(score)
    raise CheckpointError(
        f"--ckpt_path best: {newest} records no best checkpoint (no validation ran, or no monitored metric); "
        "use --ckpt_path with a file."
    )


def _inside(path: Path, directory: str | os.PathLike) -> bool:
    """Whether ``path`` lies in ``directory`` (symbolic links and ``..`` resolved)."""
    return Path(path).resolve().parent == Path(directory).resolve()


def check_filename(filename: str | None) -> None:
    """Refuse a ``--checkpoint.filename`` that would write outside the checkpoint directory."""
    if filename and (os.path.isabs(filename) or ".." in Path(filename).parts):
        raise ConfigError(
            f"--checkpoint.filename {filename!r} leads outside the checkpoint directory; give a plain file name "
            "(e.g. '{epoch}-{step}') and choose the folder with --checkpoint.dirpath."
        )


class Checkpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with a ``last.ckpt`` that always holds the latest state, written atomically.

    With a monitored metric, Lightning rewrites ``last.ckpt`` only when a new best is saved, so after a validation
    loss that got worse "last" would silently be an older model. Here it is rewritten after every validation, at the
    end of every epoch and of training, and every ``last_every_n_steps`` optimiser steps (``trainer.save_checkpoint``
    is collective; rank 0 writes). Saves go through ``AtomicCheckpointIO`` (installed at setup when the strategy
    uses Lightning's default writer), so the replaced ``last.ckpt`` survives as ``last.previous.ckpt``. Every
    rank's RNG states are stored and restored when training resumes.

    Signals (``gridtnp.training.signals``): on SIGTERM (what Slurm, Kubernetes and ``timeout`` send first), SIGINT
    or SIGHUP the current step finishes, ``last.ckpt`` is written and training stops without another validation;
    ``stop_signal`` then holds the signal and the CLI exits with status 128 + signal. Under Slurm, SIGUSR1 does the
    same and requeues the job (``requeued`` says how it went); elsewhere it writes ``last.ckpt`` and training goes
    on. A second SIGINT stops at once (``HardStop``). Under DDP the ranks agree on the step (a max-reduce after
    every step and after every validation), so every rank saves the same one, collectively.

    The mode follows the monitored metric: the model's torchmetrics object of that name says whether higher is
    better (``gridtnp.metrics.monitored_direction``), so a new metric needs no list of names; a ``mode`` that would
    keep the worst model is refused.

    Args:
        last_every_n_steps: also rewrite ``last.ckpt`` every this many optimiser steps (``None``: only at epoch
            ends, validations and the end of training).
        mode: ``"min"`` or ``"max"``; ``None`` (default): from the monitored metric's ``higher_is_better``.
        **kwargs: ``ModelCheckpoint``'s arguments.
    """

    def __init__(
        self, *, last_every_n_steps: int | None = None, mode: Literal["min", "max"] | None = None, **kwargs: Any
    ) -> None:
        check_filename(kwargs.get("filename"))
        if last_every_n_steps is not None and last_every_n_steps < 1:
            raise ConfigError(
                f"--checkpoint.last_every_n_steps must be >= 1 (or null: only at epoch ends and validations); got "
                f"{last_every_n_steps}."
            )
        super().__init__(mode=mode or "max", **kwargs)
        self.mode_given = mode
        self.last_every_n_steps = last_every_n_steps
        self._last_written_step = -1
        self._pending_rng: dict[str, Any] | None = None
        self.stop_signal: int | None = None  # the signal that stopped training, once it has
        self.requeued: str | None = None  # what ``scontrol requeue`` did, once a requeue signal stopped training
        self.stop_reported = False  # the stop line is printed (at the requeue: Slurm may end the tasks before exit)
        self.signals = SignalPath()

    def follow_metric(self, pl_module: L.LightningModule) -> None:
        """Set the mode from the monitored metric's ``higher_is_better``, or refuse a given mode against it."""
        if self.monitor is None:
            return
        higher = monitored_direction(pl_module, self.monitor)
        if self.mode_given is None:
            if higher is None:
                raise ConfigError(
                    f"--checkpoint.monitor {self.monitor}: {type(pl_module).__name__} has no metric of that name that "
                    "says whether higher is better (torchmetrics' higher_is_better); set --checkpoint.mode min or max."
                )
            self.mode = "max" if higher else "min"
            self.kth_value = torch.tensor(-torch.inf if higher else torch.inf)
        elif higher is not None and (self.mode_given == "max") != higher:
            better = "higher" if higher else "lower"
            raise ConfigError(
                f"--checkpoint.mode {self.mode_given} with --checkpoint.monitor {self.monitor} would keep the worst "
                f"model ({better} is better for it); use mode {'max' if higher else 'min'}, or leave mode out."
            )

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.install(trainer)  # after Lightning's handlers, which would end the run without a save

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.signals.install(trainer)

    def _act_on_signals(self, trainer: L.Trainer) -> None:
        """At a step boundary every rank reaches: save and stop (or requeue) as the ranks agree."""
        stop, save = self.signals.agree(trainer)
        if (stop or save) and trainer.global_step != self._last_written_step:
            self._write_last(trainer)
        if stop:
            self.stop_signal = stop
            trainer.should_stop = True
            trainer.limit_val_batches = 0  # no validation on the way out (Lightning runs one when should_stop is set)
            if stop == self.signals.requeue_signal and self.requeued is None:
                self.requeued = requeue_job() if trainer.is_global_zero else ""
                self.signals.requeued = True  # every rank: Slurm's SIGTERM to the requeued tasks is ignored from now
                if trainer.is_global_zero:  # now: the requeue cancels the job step, which may end the tasks early
                    from gridtnp.training.summary import stop_line

                    print(stop_line(trainer, [], stop), file=sys.stderr, flush=True)
                    self.stop_reported = True

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.stage = stage
        if stage == "fit":  # only training keeps a best checkpoint
            self.follow_metric(pl_module)
        if stage == "fit" and trainer.is_global_zero and self.dirpath and os.path.isdir(self.dirpath):
            for leftover in Path(self.dirpath).glob(".*.tmp-*"):  # from a write killed before its rename
                remove_path(leftover)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if stage == "fit":
            disable_lightning_requeue(trainer)

    def _write_last(self, trainer: L.Trainer) -> None:
        if self.save_last and self.dirpath and not trainer.sanity_checking:
            path = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
            self.last_model_path = path  # so Lightning's own "last" save overwrites it instead of adding last-v1
            trainer.save_checkpoint(path, weights_only=False)  # the full state, to resume from
            self._last_written_step = trainer.global_step

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        """Lightning's own "last" save (after a new best) is skipped: ``_write_last`` owns ``last.ckpt``."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        n, step = self.last_every_n_steps, trainer.global_step
        if n and step > 0 and step % n == 0 and step != self._last_written_step:
            self._write_last(trainer)
        self._act_on_signals(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if trainer.global_step != self._last_written_step:  # not already written by the epoch's validation
            self._write_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._write_last(trainer)
            self._act_on_signals(trainer)  # a signal during validation stops here, not after the next step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if trainer.global_step != self._last_written_step:
            self._write_last(trainer)
        self.signals.restore()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self.signals.restore()  # also when training ended by an exception

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:  # a copy: the live hyper-parameters keep the credentials the run needs
                checkpoint[key] = redact(checkpoint[key])
        checkpoint["gridtnp_rng"] = all_gather_objects(trainer, rng_state())
        if trainer.logger is not None and trainer.logger.version is not None:
            # A resumed run logs on into the same folder (the CLI reads this back), so its curves do not split.
            checkpoint[LOGGER_VERSION] = trainer.logger.version

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        # Before the first validation there is no model to rank (last.ckpt is written anyway); Lightning would warn
        # that the module does not log the metric, which it does, at validation.
        ran = trainer.fit_loop.epoch_loop.val_loop._has_run
        if self.monitor is not None and self.monitor not in monitor_candidates and not ran:
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Only ``fit`` resumes the record of kept checkpoints: ``test``, ``validate`` and ``predict`` never read it,
        and Lightning would warn there that the folder it was written in has changed (``--ckpt_path best`` is read
        from the file by ``best_checkpoint``)."""
        if getattr(self, "stage", "fit") == "fit":
            super().load_state_dict(state_dict)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("gridtnp_rng")
        if states:
            # Applied just before the first training batch, after Lightning has built its data iterators.
            self._pending_rng = states[trainer.global_rank] if trainer.global_rank < len(states) else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kw: Any) -> None:
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None
