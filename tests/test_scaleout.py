"""Scale-out in subprocesses: DDP on CPU (gloo), a SIGKILLed run resumed, SLURM requeue on SIGUSR1.

Each test launches ``gridtnp fit`` (a few CLI start-ups, about a minute in all on 2 busy cores), so they are marked
``slow``; ``make test`` runs them in a second pytest invocation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.nn.likelihoods import log_likelihood
from tests.recording import fingerprint, read_records

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def fit_command(run_dir: Path, records: Path, *extra: str, pause_at_step: int | None = None) -> list[str]:
    """``gridtnp fit`` of a small CNP on 1-D GP tasks, recording losses and tasks into ``records``."""
    callback = {"class_path": "tests.recording.Record", "init_args": {"out": str(records)}}
    if pause_at_step is not None:
        callback["init_args"]["pause_at_step"] = pause_at_step
    return [
        sys.executable, "-m", "gridtnp.cli", "fit",
        "--config", str(ROOT / "recipes" / "gp1d_cnp.yaml"),
        "--model.init_args.dim", "32",
        "--trainer.default_root_dir", str(run_dir),
        "--checkpoint.dirpath", str(run_dir / "checkpoints"),
        "--checkpoint.last_every_n_steps", "2",
        "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.max_steps", "12",
        "--data.init_args.batch_size", "8",
        "--data.init_args.train_batches", "5",
        "--data.init_args.val_batches", "3",
        "--trainer.callbacks", json.dumps([callback]),
        *extra,
    ]  # fmt: skip


def cli_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}: {proc.stderr.read()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def train_steps(records: Path, rank: int = 0) -> dict[int, dict]:
    """Training records by global step (a resumed run overwrites the steps it redid)."""
    return {r["step"]: r for r in read_records(records, rank) if r["kind"] == "train"}


def test_sigkilled_run_resumes_from_its_last_checkpoint(tmp_path):
    """Killed after its second checkpoint (step 4, mid-epoch), the relaunched command resumes at step 4 and its
    losses and tasks match an uninterrupted run with the same seed (tolerance 1e-6: CPU float32 is deterministic)."""
    env = cli_env()
    reference = subprocess.Popen(
        fit_command(tmp_path / "ref", tmp_path / "ref_rec"), cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    command = fit_command(tmp_path / "run", tmp_path / "rec", pause_at_step=4)
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for((tmp_path / "rec" / "paused").exists, "the pause after step 4", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=True)["global_step"] == 4
    assert torch.load(ckpt_dir / "last.previous.ckpt", weights_only=True)["global_step"] == 2
    assert (ckpt_dir / "config.yaml").exists()
    before_kill = train_steps(tmp_path / "rec")
    assert sorted(before_kill) == [1, 2, 3, 4]

    resumed = run(command, tmp_path, env)  # the same command: resumes by itself from the checkpoint directory
    assert f"resuming from {ckpt_dir / 'last.ckpt'} (global step 4)" in resumed.stdout
    records = read_records(tmp_path / "rec")
    after = [r for r in records[len(before_kill) :] if r["kind"] == "train"]
    assert after[0]["step"] == 5  # the first step after the checkpoint, not a replayed epoch

    out, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err[-4000:]
    expected = train_steps(tmp_path / "ref_rec")
    got = train_steps(tmp_path / "rec")
    assert sorted(got) == sorted(expected) == list(range(1, 13))
    for step in expected:
        assert got[step]["task"] == expected[step]["task"], f"step {step} trained on other tasks"
        assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, (step, got[step], expected[step])
    val = {r["step"]: r["metrics"] for r in read_records(tmp_path / "rec") if r["kind"] == "val_metrics"}
    val_ref = {r["step"]: r["metrics"] for r in read_records(tmp_path / "ref_rec") if r["kind"] == "val_metrics"}
    assert sorted(val) == sorted(val_ref) == [5, 10]
    for step, metrics in val_ref.items():
        assert val[step]["val/loglik"] == pytest.approx(metrics["val/loglik"], abs=1e-6)
