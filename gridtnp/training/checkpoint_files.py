"""Checkpoint files: atomic writes that keep the replaced version, integrity checks, single entries read back.

* ``AtomicCheckpointIO`` writes every checkpoint to a temporary file in the same directory, fsyncs it and renames it
  into place, so a crash or pre-emption mid-write never leaves a half-written ``last.ckpt``. When it overwrites a
  file (``last.ckpt``), the old version is kept as ``last.previous.ckpt``.
* ``verify_checkpoint`` checks a file is a complete archive whose records match their CRC-32 (torch checkpoints are
  zip archives), without unpickling it; ``unusable_reason`` also checks it loads safely and holds a training state.
"""

from __future__ import annotations

import errno
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from gridtnp.files import is_url, remove_path, replace_path
from gridtnp.redaction import redact_url
from gridtnp.training.checkpoint_loading import UnsafeCheckpointError, load_checkpoint
from gridtnp.training.signals import uninterrupted

PREVIOUS = ".previous"  # last.ckpt -> last.previous.ckpt


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
        tmp = Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            with uninterrupted():  # a second Ctrl-C waits for the renames: last.ckpt is never missing
                replace_path(tmp, path, previous)
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
        finally:
            remove_path(tmp)  # a write cut short (an error, a second Ctrl-C) leaves no temporary file

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
