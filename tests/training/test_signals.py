"""Ctrl-C as a person presses it: once (save after the step, no validation, a line saying what was saved) and twice
(stop at once, the last complete last.ckpt kept); a second Ctrl-C during a checkpoint's renames waits for them.

The two ``gridtnp fit`` runs start together (about 30 s on 2 busy cores); the heavier signal tests (SIGHUP, DDP,
Slurm requeue) are in ``test_scaleout.py`` (``slow``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch

from gridtnp.training.checkpoint_files import AtomicCheckpointIO, unusable_reason
from gridtnp.training.signals import FIRST_CTRL_C, HardStop, SignalPath, uninterrupted
from tests.recording import read_records
from tests.training.test_scaleout import cli_env, fit_command, wait_for


def test_second_ctrl_c_waits_for_the_renames_then_stops():
    path = SignalPath()
    path.received[signal.SIGINT] = True  # the first Ctrl-C came
    path._previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, path._on_signal)
    try:
        reached_end = False
        with pytest.raises(HardStop), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here: deferred
            reached_end = True
        assert reached_end
        with pytest.raises(HardStop):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        path.restore()


class Interrupting(dict):
    """A checkpoint whose pickling is cut by a second Ctrl-C (``HardStop``) half-way through the write."""

    def __reduce_ex__(self, protocol):
        raise HardStop


def test_a_save_cut_by_a_second_ctrl_c_leaves_the_previous_last_ckpt(tmp_path):
    io, last = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 4}, last)
    with pytest.raises(HardStop):
        io.save_checkpoint({"state_dict": Interrupting(), "global_step": 5}, last)
    assert unusable_reason(last) is None
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left


def test_ctrl_c_once_saves_the_step_without_validation_and_twice_stops_at_once(tmp_path):
    env = cli_env()
    once_dir, twice_dir = tmp_path / "once", tmp_path / "twice"
    # Step 5 ends the epoch (5 batches), where a validation would normally run.
    once = fit_command(once_dir, once_dir / "rec", "--checkpoint.last_every_n_steps", "100", pause_at_step=4,
                       pause_seconds=4.0)  # fmt: skip
    twice = fit_command(twice_dir, twice_dir / "rec", pause_at_step=4, pause_seconds=120.0)
    procs = [
        subprocess.Popen(c, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in (once, twice)
    ]
    try:
        for proc, out in zip(procs, (once_dir, twice_dir), strict=True):
            wait_for((out / "rec" / "paused").exists, "the pause before step 5", proc, timeout=240)
            proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        procs[1].send_signal(signal.SIGINT)  # the second Ctrl-C, during the 120 s pause: no waiting for it
        (out1, err1), (out2, err2) = (p.communicate(timeout=90) for p in procs)
    finally:
        for proc in procs:
            proc.kill()

    assert procs[0].returncode == 130, err1[-3000:]
    assert FIRST_CTRL_C in err1
    last = once_dir / "checkpoints" / "last.ckpt"
    stop = [line for line in err1.splitlines() if line.startswith("gridtnp: stopped by SIGINT")]
    assert stop and stop[0].startswith("gridtnp: stopped by SIGINT after step 5; saved ")
    assert stop[0].split("; saved ")[1].startswith(os.path.relpath(last, tmp_path))
    assert "resume with: gridtnp fit --config " in stop[0] and "--ckpt_path " in stop[0]
    assert unusable_reason(last) is None and torch.load(last, weights_only=True)["global_step"] == 5
    records = read_records(once_dir / "rec")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5]
    assert not [r for r in records if r["kind"] in ("val", "val_metrics")]  # no validation after the Ctrl-C
    assert "gridtnp: step 5:" not in out1

    assert procs[1].returncode == 130, err2[-3000:]
    assert err2.count(FIRST_CTRL_C) == 1
    last = twice_dir / "checkpoints" / "last.ckpt"
    line = next(x for x in err2.splitlines() if x.startswith("gridtnp: stopped by a second SIGINT"))
    assert "during step 5, without waiting" in line
    assert f"kept {os.path.relpath(last, tmp_path)} (step 4)" in line and "resume with: gridtnp fit" in line
    assert "Detected KeyboardInterrupt" not in out2 + err2 and "Traceback" not in err2
    assert unusable_reason(last) is None and torch.load(last, weights_only=True)["global_step"] == 4


def test_sigterm_stays_ignored_after_a_requeue_so_the_last_lines_are_printed():
    before = signal.getsignal(signal.SIGTERM)
    path = SignalPath()
    path._previous[signal.SIGTERM] = before
    signal.signal(signal.SIGTERM, path._on_signal)
    path.requeued = True  # what the checkpoint callback sets once `scontrol requeue` ran
    try:
        path.restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm's SIGTERM to a requeued task: the process lives on
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, before)
    unrequeued = SignalPath()
    unrequeued._previous[signal.SIGTERM] = before
    signal.signal(signal.SIGTERM, unrequeued._on_signal)
    unrequeued.restore()
    assert signal.getsignal(signal.SIGTERM) is before
