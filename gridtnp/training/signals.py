"""One path for the signals that stop, save or requeue a run: SIGINT, SIGTERM, SIGHUP and SIGUSR1.

The handlers only record a signal (and, for the first Ctrl-C, say at once what will happen). The ranks agree at the
next step boundary (``SignalPath.agree``: a max-reduce of the flags, a collective every rank reaches), so under DDP
every rank saves the same step with the same collective ``trainer.save_checkpoint``, never inside a handler, which
could interrupt a rank in the middle of a gradient all-reduce. Then:

* SIGTERM (what Slurm, Kubernetes and ``timeout`` send), SIGINT (Ctrl-C) and SIGHUP (a closed terminal): stop.
* SIGUSR1 under Slurm (``--signal=SIGUSR1@90``; or the requeue signal of a ``SLURMEnvironment`` plugin): after the
  save, requeue the job (``requeue_job``: ``scontrol requeue``, rank 0) and stop. Lightning's own requeue
  handler, which saves inside the handler, is turned off (``disable_lightning_requeue``). Outside Slurm, SIGUSR1
  saves and training goes on.
* A second Ctrl-C raises ``HardStop`` at once; a rename that replaces ``last.ckpt`` is finished first
  (``uninterrupted``), so the newest complete checkpoint is always there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FIRST_CTRL_C = "gridtnp: saving after this step; Ctrl-C again to stop without waiting"


class HardStop(BaseException):
    """A second Ctrl-C: stop without waiting. Not a ``KeyboardInterrupt``, which Lightning turns into exit status 1
    after its own message; the CLI says what was saved instead."""


_critical = 0  # > 0 while a block that must not be cut (a checkpoint's renames) runs
_deferred = False  # a HardStop came during such a block


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Defer a second Ctrl-C's ``HardStop`` until the block ends (the renames that put a new ``last.ckpt`` in place)."""
    global _critical, _deferred
    _critical += 1
    try:
        yield
    finally:
        _critical -= 1
        if _critical == 0 and _deferred:
            _deferred = False
            raise HardStop


def slurm_requeue_signal(trainer: L.Trainer) -> int | None:
    """The signal that asks this run to requeue itself: the Slurm environment's (SIGUSR1 by default), or None
    outside Slurm."""
    environment = getattr(trainer._accelerator_connector, "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment):
        return int(environment.requeue_signal or signal.SIGUSR1)
    return None


def disable_lightning_requeue(trainer: L.Trainer) -> None:
    """Turn off Lightning's Slurm requeue handler (``SLURMEnvironment(auto_requeue=False)``): it saves inside the
    signal handler on each rank, a collective that can hang under DDP. ``SignalPath`` requeues instead."""
    environment = getattr(trainer._accelerator_connector, "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment):
        environment.auto_requeue = False  # read by Lightning's signal connector when fit starts


def requeue_job() -> str:
    """Run ``scontrol requeue`` for this Slurm job (array tasks included); the job id, or what went wrong."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"[0-9_]+", job):
        return f"not requeued: SLURM_JOB_ID {job!r} is not a job id"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"not requeued: scontrol requeue {job} failed ({err})"
    if done.returncode != 0:
        return f"not requeued: scontrol requeue {job} exited {done.returncode} ({done.stderr.strip()[:200]})"
    return f"requeued Slurm job {job}"


class SignalPath:
    """The handlers and the step-boundary agreement of one ``fit``.

    ``install`` takes SIGTERM, SIGINT, SIGHUP and SIGUSR1 (or the Slurm requeue signal) from whatever held them
    (Lightning's handlers included); ``restore`` gives them back. ``agree(trainer)`` is collective under DDP.
    """

    def __init__(self) -> None:
        self.received: dict[int, bool] = {}
        self.requeue_signal: int | None = None
        self.requeued = False  # set once this run asked Slurm to requeue it (see ``restore``)
        self._previous: dict[int, Any] = {}

    def install(self, trainer: L.Trainer) -> None:
        """Record signals from now on (main thread only: Python delivers signals there)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        self.requeue_signal = slurm_requeue_signal(trainer)
        wanted = {*STOP_SIGNALS, signal.SIGUSR1, *([self.requeue_signal] if self.requeue_signal else [])}
        for signum in wanted:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        """Give the signals back; after a requeue SIGTERM stays ignored: Slurm sends it to the tasks of a requeued
        job while they shut down, and it must not cut the run's last lines (the save and the requeue are done)."""
        for signum, handler in self._previous.items():
            if signum == signal.SIGTERM and self.requeued:
                handler = signal.SIG_IGN
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        global _deferred
        if signum == signal.SIGINT and self.received.get(signum):
            if _critical:
                _deferred = True
                return
            raise HardStop
        first = not any(self.received.get(s) for s in STOP_SIGNALS)
        self.received[signum] = True
        if signum == signal.SIGINT and first and rank_zero_only.rank == 0:
            os.write(sys.stderr.fileno(), f"\n{FIRST_CTRL_C}\n".encode())  # not print(): a handler may cut one

    def agree(self, trainer: L.Trainer) -> tuple[int | None, bool]:
        """The signal that stops training on any rank (None: none; the requeue signal when that came) and whether
        any rank asked for a save: a max-reduce over the ranks (collective), so every rank acts on the same step."""
        stop = next((int(s) for s in STOP_SIGNALS if self.received.get(s)), 0)
        requeue = int(bool(self.requeue_signal and self.received.pop(self.requeue_signal, False)))
        save = int(bool(self.received.pop(signal.SIGUSR1, False)))
        if trainer.world_size > 1:
            flags = torch.tensor([stop, requeue, save], device=trainer.strategy.root_device)
            flags = trainer.strategy.reduce(flags, reduce_op="max")
            stop, requeue, save = (int(f) for f in flags)
        if requeue and not stop:
            stop = int(self.requeue_signal or signal.SIGUSR1)
        return (stop or None), bool(save)
