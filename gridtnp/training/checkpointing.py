"""Fault-tolerant checkpoints: atomic writes, a kept previous version, integrity checks, resume resolution, RNG state.

* ``AtomicCheckpointIO`` writes every checkpoint to a temporary file in the same directory, fsyncs it and renames it
  into place, so a crash or pre-emption mid-write never leaves a half-written ``last.ckpt``. When it overwrites a
  file (``last.ckpt``), the old version is kept as ``last.previous.ckpt``.
* ``verify_checkpoint`` checks a file is a complete archive whose records match their CRC-32 (torch checkpoints are
  zip archives), without unpickling it.
* ``resume_checkpoint`` picks the newest readable checkpoint of a run (its checkpoint directories and Lightning's
  SLURM ``hpc_ckpt_*.ckpt``), warning about, naming and skipping every corrupt or truncated file.
* ``Checkpoint`` is gridtnp's ``ModelCheckpoint``: best-by-metric plus a ``last.ckpt`` that always holds the latest
  state, rewritten every ``last_every_n_steps`` steps, at the end of each epoch and after each validation; it also
  stores every rank's RNG states and restores them when training resumes.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import threading
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from gridtnp.files import atomic_write, is_url, remove_path
from gridtnp.metrics import monitored_direction
from gridtnp.redaction import redact, redact_url
from gridtnp.registry import ConfigError
from gridtnp.training.checkpoint_loading import UnsafeCheckpointError, load_checkpoint

PREVIOUS = ".previous"  # last.ckpt -> last.previous.ckpt
CONFIG_NAME = "config.yaml"
LOGGER_VERSION = "gridtnp_logger_version"  # checkpoint entry: the logger version (folder) of the run


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with what was wrong and which file."""


def previous_path(path: str | os.PathLike) -> Path:
    """The file that keeps the version of ``path`` it replaced: ``last.ckpt`` -> ``last.previous.ckpt``."""
    path = Path(path)
    return path.with_name(path.stem + PREVIOUS + path.suffix)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic (temporary file, fsync, rename) and keep the replaced version.

    Remote paths (``s3://...``) fall back to Lightning's writer.
    """

    def __init__(self, keep_previous: bool = True) -> None:
        super().__init__()
        self.keep_previous = keep_previous

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or is_url(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        previous = previous_path(path) if self.keep_previous else None
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, f), previous)
        except (OSError, RuntimeError) as err:
            # torch.save reports a full disk as "[enforce fail at inline_container.cc] ... file write failed".
            directory = Path(path).parent
            free = shutil.disk_usage(directory).free if directory.is_dir() else 0
            full = getattr(err, "errno", None) == errno.ENOSPC or "No space left" in str(err) or free < 2**20
            if not full:
                raise
            raise CheckpointError(
                f"cannot write checkpoint {path}: no space left on the device of {directory} "
                f"({free / 2**20:.1f} MB free); the previous checkpoint is intact. Free some space or point "
                "--checkpoint.dirpath at another disk, then rerun the same command to resume."
            ) from err

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Tensors and plain values only (``gridtnp.training.checkpoint_loading``), whatever Lightning asks for."""
        if is_url(path):
            raise CheckpointError(f"checkpoint {redact_url(str(path))}: download it and pass the local file.")
        return load_checkpoint(path)


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """``None`` if ``path`` is a complete torch checkpoint whose records match their CRC-32, else what is wrong."""
    try:
        if os.path.getsize(path) == 0:
            return "empty file"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        return f"truncated or not a torch checkpoint archive ({err})"
    except (OSError, EOFError, RuntimeError) as err:
        return f"unreadable ({err})"
    if bad is not None:
        return f"corrupt record {bad!r} (CRC-32 mismatch)"
    return None


def unusable_reason(path: str | os.PathLike) -> str | None:
    """``None`` if ``path`` is an intact checkpoint that loads safely (``weights_only``) and holds a training
    state (``state_dict``, ``global_step``), else what is wrong: damage, unsafe pickled objects or a foreign file."""
    reason = verify_checkpoint(path)
    if reason is not None:
        return reason
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return err.reason if isinstance(err, UnsafeCheckpointError) else f"unreadable ({first[:120]})"
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        return "not a training checkpoint (no state_dict / global_step): a file `gridtnp fit` did not write"
    return None


def checkpoint_entry(path: str | os.PathLike, key: str) -> Any:
    """One top-level entry of a (verified) checkpoint, or None; tensors are memory-mapped, not read."""
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except Exception:
        return None
    return ckpt.get(key) if isinstance(ckpt, dict) else None


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` stored in a (verified) checkpoint."""
    step = checkpoint_entry(path, "global_step")
    return int(step) if step is not None else None


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
        if not path.is_file() or not _inside(path, dirpath):  # the folder was moved since, or a foreign path
            path = Path(dirpath) / path.name
        if not path.is_file():
            raise CheckpointError(f"--ckpt_path best: {newest} names {best} as the best checkpoint, which is gone.")
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


def rng_state() -> dict[str, Any]:
    """This process's torch, CUDA, numpy and Python RNG states, as types ``torch.load(weights_only=True)`` accepts."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos)}
        | {"has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from ``rng_state``."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _all_gather_objects(trainer: L.Trainer, obj: Any) -> list[Any]:
    """``obj`` from every rank (a collective call), or ``[obj]`` when not distributed."""
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
    return [obj]


class Checkpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with a ``last.ckpt`` that always holds the latest state, written atomically.

    With a monitored metric, Lightning rewrites ``last.ckpt`` only when a new best is saved, so after a validation
    loss that got worse "last" would silently be an older model. Here it is rewritten after every validation, at the
    end of every epoch and of training, and every ``last_every_n_steps`` optimiser steps (``trainer.save_checkpoint``
    is collective; rank 0 writes). Saves go through ``AtomicCheckpointIO`` (installed at setup when the strategy
    uses Lightning's default writer), so the replaced ``last.ckpt`` survives as ``last.previous.ckpt``. Every
    rank's RNG states are stored and restored when training resumes.

    Signals, as a cluster expects: on SIGTERM (what SLURM, Kubernetes and ``timeout`` send first) or SIGINT the
    current step finishes, ``last.ckpt`` is written and training stops; ``stop_signal`` then holds the signal and
    the CLI exits with status 128 + signal. A second SIGINT interrupts at once. Outside SLURM (whose requeue handler
    Lightning installs), SIGUSR1 writes ``last.ckpt`` after the current step and training goes on. Under DDP the
    ranks agree on the step (a max-reduce of the flags after every step), so every rank saves the same one.

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
        self._received: dict[int, bool] = {}  # signal -> received, set by the handlers
        self._previous_handlers: dict[int, Any] = {}

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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Install the signal handlers (after Lightning's, which would end the run with status 0 and no save)."""
        super().on_train_start(trainer, pl_module)
        if threading.current_thread() is not threading.main_thread():
            return  # signals only reach the main thread
        wanted = [signal.SIGTERM, signal.SIGINT]
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):  # not taken by Lightning's SLURM requeue
            wanted.append(signal.SIGUSR1)
        for signum in wanted:
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self._received.get(signum):
            signal.signal(signum, signal.default_int_handler)
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._received[signum] = True

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}

    def _agreed_signals(self, trainer: L.Trainer) -> tuple[int | None, bool]:
        """The stop signal received by any rank (or None) and whether any rank was asked for a save (SIGUSR1)."""
        stop = next((s for s in (signal.SIGTERM, signal.SIGINT) if self._received.get(s)), 0)
        save = int(bool(self._received.pop(signal.SIGUSR1, False)))
        if trainer.world_size > 1:
            flags = torch.tensor([stop, save], device=trainer.strategy.root_device)
            flags = trainer.strategy.reduce(flags, reduce_op="max")
            stop, save = int(flags[0]), int(flags[1])
        return (stop or None), bool(save)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":  # only training keeps a best checkpoint
            self.follow_metric(pl_module)
        if stage == "fit" and trainer.is_global_zero and self.dirpath and os.path.isdir(self.dirpath):
            for leftover in Path(self.dirpath).glob(".*.tmp-*"):  # from a write killed before its rename
                remove_path(leftover)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()

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
        stop, save = self._agreed_signals(trainer)
        if (stop or save or (n and step > 0 and step % n == 0)) and step != self._last_written_step:
            self._write_last(trainer)
        if stop:
            self.stop_signal = stop
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if trainer.global_step != self._last_written_step:  # not already written by the epoch's validation
            self._write_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn == "fit":
            self._write_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if trainer.global_step != self._last_written_step:
            self._write_last(trainer)
        self._restore_handlers()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._restore_handlers()  # also when training ended by an exception

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:  # a copy: the live hyper-parameters keep the credentials the run needs
                checkpoint[key] = redact(checkpoint[key])
        checkpoint["gridtnp_rng"] = _all_gather_objects(trainer, rng_state())
        if trainer.logger is not None and trainer.logger.version is not None:
            # A resumed run logs on into the same folder (the CLI reads this back), so its curves do not split.
            checkpoint[LOGGER_VERSION] = trainer.logger.version

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("gridtnp_rng")
        if states:
            # Applied just before the first training batch, after Lightning has built its data iterators.
            self._pending_rng = states[trainer.global_rank] if trainer.global_rank < len(states) else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kw: Any) -> None:
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None


class SaveConfig(SaveConfigCallback):
    """LightningCLI's config saver that also writes the resolved config beside the checkpoints when fitting.

    Credentials (``gridtnp.redaction``) are replaced in every saved copy. When fitting, nothing is written until
    training starts, after a resumed checkpoint has been restored: a resume that fails leaves the saved recipe
    beside the checkpoints as it was (it still describes them).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            return  # written in on_train_start
        self._save(trainer, pl_module, stage)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer, pl_module, "fit")

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config
        self.config = redact(config)
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            self.config = config

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        text = self.parser.dump(self.config, skip_none=False).encode()
        for callback in trainer.checkpoint_callbacks:
            dirpath = getattr(callback, "dirpath", None)
            if dirpath and not is_url(dirpath):
                atomic_write(Path(dirpath) / CONFIG_NAME, lambda f: f.write(text))
