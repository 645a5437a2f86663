"""A lock file in a run's checkpoint directory, so that two runs never write one ``last.ckpt``.

``lock_directory(directory)`` writes ``.gridtnp.lock`` (process id, host, Slurm job) or refuses while another live
run holds it; a lock left by a dead process, or by an earlier run of the same requeued Slurm job, is taken over
with a line. ``unlock_directory(path)`` removes it when the run ends.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gridtnp.files import atomic_write, is_url
from gridtnp.registry import ConfigError
from gridtnp.training.checkpointing import CheckpointError

LOCK_NAME = ".gridtnp.lock"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_directory(directory: str | os.PathLike) -> Path | None:
    """Take ``directory``'s lock file (``.gridtnp.lock``: process id, host, SLURM job id) for a ``fit`` writing there.

    A lock held by a live process on this host (or by any process on another host, unless it is an earlier run of
    the same SLURM job, requeued) is a ``CheckpointError``; a lock left by a process that no longer runs is taken
    over with a line saying so. Returns the lock's path (None
    for a remote directory); ``unlock_directory`` removes it.
    """
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
    host, job = socket.gethostname(), os.environ.get("SLURM_JOB_ID", "-")
    path, mine = directory / LOCK_NAME, f"{os.getpid()} {host} {job}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        owner = path.read_text().split() if path.is_file() else []
        pid = int(owner[0]) if owner and owner[0].isdigit() else None
        other_host = owner[1] if len(owner) > 1 and owner[1] != host else None
        # A requeued SLURM job (same job id) may start on another node: its earlier run is over.
        requeued = job != "-" and len(owner) > 2 and owner[2] == job
        alive = other_host is not None or (pid is not None and _process_alive(pid))
        if pid is not None and pid != os.getpid() and alive and not requeued:
            where = f" on {other_host}" if other_host else ""
            raise CheckpointError(
                f"--checkpoint.dirpath {directory} is in use by a running gridtnp fit (process {pid}{where}; lock "
                f"file {path}): two runs would overwrite each other's last.ckpt. Wait for it to finish, or give this "
                "run another --checkpoint.dirpath (delete the lock file if that run is known to be gone)."
            ) from None
        if pid != os.getpid():
            print(
                f"gridtnp: taking over the lock of {directory} from process {pid}, which is no longer running",
                flush=True,
            )
        atomic_write(path, lambda f: f.write(mine.encode()))
        return path
    with os.fdopen(fd, "w") as f:
        f.write(mine)
    return path


def unlock_directory(path: Path | None) -> None:
    """Remove a lock file ``lock_directory`` took, if it is still this process's."""
    if path is None:
        return
    try:
        if path.read_text().split()[:1] == [str(os.getpid())]:
            path.unlink()
    except (OSError, IndexError):
        pass
