"""Writing files and directory stores so that a crash never leaves a half-written one under the target's name.

* ``replacing(path, previous=None)``: a context manager that yields a temporary path beside ``path`` to write a
  file or a directory (a Zarr store) to; when the block ends without error the temporary replaces ``path``
  (``replace_path``), and in every case no temporary is left behind.
* ``replace_path(tmp, out, previous=None)``: move the file or directory ``tmp`` to ``out``.
* ``atomic_write(path, write, previous=None)``: ``write(file)`` fills a temporary file, which is fsynced and renamed
  over ``path``; the directory is fsynced after the rename.

With ``previous``, the version of ``path`` being replaced is kept there instead of deleted. ``is_url(path)``: whether
a path is remote (``gs://...``), which none of these write to. ``out_of_space(err)``: whether an error, or one it
was raised from, is a full disk or quota.

``check_output(path, what, option, overwrite, same_kind)``: outputs never replace what they did not write. An
existing ``path`` is refused unless the user passed the overwrite ``option``, and even then unless it is the same
kind of thing (``same_kind(path)``): a prediction file never replaces a data store, a plot folder never a folder of
other files.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from gridtnp.registry import ConfigError


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a remote URL (``gs://``, ``s3://``, ``https://``, ...) rather than a local path."""
    return "://" in str(path)


def out_of_space(err: BaseException | None, where: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``err`` or an error in its chain (``__cause__``, ``__context__``) is a full disk or quota, or, given
    the folder written to (``where``), whether under 1 MiB is left there (HDF5 reports a full disk as its own
    error)."""
    if where is not None:
        try:
            if shutil.disk_usage(where).free < 2**20:
                return True
        except OSError:
            pass
    seen = 0
    while err is not None and seen < 20:  # libraries re-raise I/O errors as their own, the OSError underneath
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def check_output(
    path: str | os.PathLike, what: str, option: str, overwrite: bool, same_kind: Callable[[Path], bool]
) -> None:
    """Raise a ``ConfigError`` naming ``path`` if writing ``what`` there would replace something it should not."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if not overwrite:
        raise ConfigError(f"{path} already exists; pass {option} to replace it with the {what}.")
    if not same_kind(path):
        raise ConfigError(
            f"{path} exists and is not a {what} written by gridtnp; refusing to replace it even with {option}. "
            "Choose another path."
        )


def replace_path(tmp: str | os.PathLike, out: str | os.PathLike, previous: str | os.PathLike | None = None) -> None:
    """Move the file or directory ``tmp`` to ``out``, then fsync ``out``'s directory.

    Each rename is atomic, so ``out`` is never half-written: a file replacing a file is one rename. An existing
    ``out`` that is a directory (or, with ``previous``, any existing ``out``) is first renamed aside, to
    ``previous`` or to a hidden ``.<name>.old-*`` deleted after the swap; a crash between the two renames leaves
    ``out`` missing and its old version aside. What was written into ``tmp`` is only as durable as its writer
    made it (``atomic_write`` fsyncs the file; xarray's NetCDF and Zarr writers do not).
    """
    tmp, out = Path(tmp), Path(out)
    aside = None
    if previous is not None and out.exists():
        aside = Path(previous)
        os.replace(out, aside)
    elif out.is_dir():
        aside = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, aside)
    os.replace(tmp, out)
    if aside is not None and previous is None:
        remove_path(aside)
    _fsync_directory(out.parent)


@contextmanager
def replacing(path: str | os.PathLike, previous: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (not yet created) to write a file or directory to; when the block
    ends without error it replaces ``path`` (``replace_path``); no temporary is left either way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        replace_path(tmp, path, previous)
    finally:
        remove_path(tmp)


def atomic_write(
    path: str | os.PathLike, write: Callable[[IO[bytes]], Any], previous: str | os.PathLike | None = None
) -> None:
    """Create or replace the file ``path`` with what ``write(file)`` writes: a temporary file, fsynced, then renamed."""
    with replacing(path, previous) as tmp, open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def remove_path(path: Path) -> None:
    """Delete a file or a directory tree; nothing if it is gone already."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; skipped where directories cannot be opened (e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
