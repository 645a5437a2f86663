"""Lock files that keep two processes out of one output: a run's checkpoint directory, a prepared store.

A lock is a file holding its owner (process id, host, Slurm job), kept under an exclusive ``flock`` for as long as
the owner runs: the kernel drops the ``flock`` when the process dies, so deciding whether a lock is stale and taking
it over happen while holding it, and two processes never both take one.

* ``lock_directory(directory)``: ``.gridtnp.lock`` in a ``fit``'s checkpoint directory, or a ``CheckpointError``
  while another live run holds it; a lock left by a dead process, or by an earlier run of the same requeued Slurm
  job, is taken over with a line. ``unlock_directory(lock)`` releases and removes it when the run ends.
* ``claim_version(root)``: the next free ``version_N`` folder under ``root``, created atomically (a run's own).
* ``locked_output(path, what)``: a context manager holding ``.<name>.lock`` beside ``path`` (``gridtnp data
  prepare --out``), or a ``ConfigError`` naming the process that writes there.

Written on ``fcntl`` rather than ``filelock``: a released lock file is removed (so no stale file is left behind),
which with ``filelock`` would let a waiter hold the ``flock`` of a removed file unless it re-checks the inode on a
descriptor ``filelock`` keeps private; and the owner line, read and rewritten while holding the ``flock``, is what
tells a live holder from a stale one (a file written by hand, or by a dead process).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gridtnp.files import is_url
from gridtnp.registry import ConfigError

LOCK_NAME = ".gridtnp.lock"


@dataclass
class HeldLock:
    """A lock file this process holds: its path and the open descriptor that keeps the ``flock``."""

    path: Path
    fd: int


class LockBusy(Exception):
    """A lock held by another live process: ``pid`` (None if unknown) on ``host`` (None: this host)."""

    def __init__(self, path: Path, pid: int | None, host: str | None) -> None:
        super().__init__(f"{path} is held by process {pid}")
        self.path, self.pid, self.host = path, pid, host


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_lock(path: Path) -> HeldLock:
    """Hold the lock file ``path`` (created if missing) or raise ``LockBusy``; a stale lock is taken over."""
    host, job = socket.gethostname(), os.environ.get("SLURM_JOB_ID", "-")
    for _ in range(10):  # the file may be removed by its releasing owner between our open and our flock
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise LockBusy(path, owner[0], owner[1]) from None
        except OSError as err:  # a file system without flock (some network mounts): the owner line alone decides
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if not same_file:
            os.close(fd)
            continue
        pid, other_host, other_job = _owner(fd)
        # A lock file written without a flock (an older gridtnp, or by hand) by a live process still counts; a
        # requeued SLURM job (same job id) may start on another node: its earlier run is over.
        requeued = job != "-" and other_job == job
        alive = other_host is not None or (pid is not None and _process_alive(pid))
        if pid is not None and pid != os.getpid() and alive and not requeued:
            os.close(fd)
            raise LockBusy(path, pid, other_host)
        if pid is not None and pid != os.getpid():
            print(f"gridtnp: taking over the lock {path} from process {pid}, which is no longer running", flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {host} {job}".encode(), 0)
        return HeldLock(path, fd)
    raise LockBusy(path, None, None)


def _owner(fd: int) -> tuple[int | None, str | None, str | None]:
    """The process id, host (None: this host) and Slurm job written in an open lock file."""
    owner = os.pread(fd, 256, 0).decode(errors="replace").split()
    pid = int(owner[0]) if owner and owner[0].isdigit() else None
    host = owner[1] if len(owner) > 1 and owner[1] != socket.gethostname() else None
    return pid, host, owner[2] if len(owner) > 2 else None


def release_lock(lock: HeldLock | None) -> None:
    """Remove and release a lock ``take_lock`` took (removed first, while still held, so no one else's goes)."""
    if lock is None:
        return
    try:
        if os.fstat(lock.fd).st_ino == os.stat(lock.path).st_ino:
            lock.path.unlink()
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.close(lock.fd)


def lock_directory(directory: str | os.PathLike) -> HeldLock | None:
    """Take ``directory``'s lock file (``.gridtnp.lock``: process id, host, SLURM job id) for a ``fit`` writing there.

    A lock held by a live process on this host (or by any process on another host, unless it is an earlier run of
    the same SLURM job, requeued) is a ``CheckpointError``; a lock left by a process that no longer runs is taken
    over with a line saying so. Returns the lock (None for a remote directory); ``unlock_directory`` releases it.
    """
    from gridtnp.training.checkpointing import CheckpointError

    if is_url(directory):
        return None
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--checkpoint.dirpath {directory} is a file, not a folder; choose a folder.")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--checkpoint.dirpath {directory}: cannot create it ({err.strerror}).") from err
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"--checkpoint.dirpath {directory} is not writable; choose a writable folder.")
    try:
        return take_lock(directory / LOCK_NAME)
    except LockBusy as busy:
        where = f" on {busy.host}" if busy.host else ""
        raise CheckpointError(
            f"--checkpoint.dirpath {directory} is in use by a running gridtnp fit (process {busy.pid}{where}; lock "
            f"file {busy.path}): two runs would overwrite each other's last.ckpt. Wait for it to finish, or give this "
            "run another --checkpoint.dirpath (delete the lock file if that run is known to be gone)."
        ) from None


def unlock_directory(lock: HeldLock | None) -> None:
    """Release a lock ``lock_directory`` took."""
    release_lock(lock)


def claim_version(root: str | os.PathLike) -> int:
    """Create the first ``version_N`` folder under ``root`` after the existing ones and return ``N``: ``mkdir``
    fails for all but one of the processes that try the same ``N``, so each gets its own."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[8:]) for p in root.glob("version_*") if p.name[8:].isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return n
        except FileExistsError:
            n += 1


@contextlib.contextmanager
def locked_output(path: Path, what: str = "gridtnp data prepare") -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``path`` while writing it; a ``ConfigError`` naming the process writing there."""
    try:
        lock = take_lock(path.with_name(f".{path.name}.lock"))
    except LockBusy as busy:
        where = f" on {busy.host}" if busy.host else ""
        raise ConfigError(
            f"--out {path} is being written by another {what} (process {busy.pid}{where}; lock file {busy.path}); "
            "wait for it to finish, or choose another --out."
        ) from None
    try:
        yield
    finally:
        release_lock(lock)
