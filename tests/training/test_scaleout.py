"""Scale-out in subprocesses: DDP on CPU (gloo), a SIGKILLed run resumed, SLURM requeue on SIGUSR1.

Each test launches ``gridtnp fit`` (a few CLI start-ups, 20-60 s each on 2 cores). The default suite runs one case
of each path in a step (a SIGKILL resumed, DDP sharding, SLURM requeue on one rank and on two; SIGUSR1 and SIGTERM
under DDP in a step take the same step-boundary path, so the requeue case stands for both, and a single rank's
SIGTERM takes the path of ``test_signals.py``'s Ctrl-C); the variants (SIGTERM on one rank, under DDP in a step and
in a validation, SIGINT, SIGHUP, SIGUSR1 outside SLURM, four ranks, every rank signalled) are ``slow``
(``make test-slow``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.nn.likelihoods import log_likelihood
from tests.recording import fingerprint, read_records

ROOT = Path(__file__).resolve().parents[2]
SLOW = pytest.mark.slow


def fit_command(
    run_dir: Path, records: Path, *extra: str, pause_at_step: int | None = None, pause_seconds: float | None = None
) -> list[str]:
    """``gridtnp fit`` of a small CNP on 1-D GP tasks, recording losses and tasks into ``records``."""
    callback = {"class_path": "tests.recording.Record", "init_args": {"out": str(records)}}
    if pause_at_step is not None:
        callback["init_args"]["pause_at_step"] = pause_at_step
    if pause_seconds is not None:
        callback["init_args"]["pause_seconds"] = pause_seconds
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
        "--data.init_args.loader.batch_size", "8",
        "--data.init_args.loader.train_batches", "5",
        "--data.init_args.loader.val_batches", "3",
        "--trainer.callbacks", json.dumps([callback]),
        *extra,
    ]  # fmt: skip


def cli_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "GRIDTNP_ALLOW_IMPORTS": "tests"}
    return {**os.environ, **env, **extra}


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

    _, err = reference.communicate(timeout=300)
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


def union_metrics(ckpt: Path, val_batches: int, batch_size: int) -> dict[str, float]:
    """Validation log-likelihood and RMSE of a checkpoint's model over the whole validation set, in one process."""
    module = NeuralProcessModule.load_from_checkpoint(ckpt, map_location="cpu")
    module.eval()
    data = from_flat_arguments(
        SyntheticDataModule, task={"name": "gp1d"}, batch_size=batch_size, val_batches=val_batches, seed=0
    )
    logliks, sq_err, count, tasks = [], 0.0, 0, []
    with torch.no_grad():
        for batch in data.val_dataloader():
            dist = module(batch)
            valid = batch.target.valid()
            logliks.append(log_likelihood(dist, batch.target.y, valid))
            sq_err += float((dist.mean[valid] - batch.target.y[valid]).double().square().sum())
            count += int(valid.sum())
            tasks.append(fingerprint(batch))
    return {
        "val/loglik": float(torch.cat(logliks).double().mean()),
        "val/rmse": (sq_err / count) ** 0.5,
        "tasks": tasks,
    }


def test_ddp_on_cpu_shards_tasks_and_reduces_metrics_over_the_union(tmp_path):
    """Two gloo processes: disjoint training tasks per rank, each validation batch evaluated once, and the reduced
    validation metrics equal the metrics of the final model over the whole validation set (3 batches on 2 ranks,
    which Lightning's padded DistributedSampler would count one batch twice for)."""
    run_dir, records = tmp_path / "run", tmp_path / "rec"
    command = fit_command(run_dir, records)
    command += ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    # train_batches counts the epoch's batches over both ranks: 6 are 3 steps, validated after the last.
    command += ["--trainer.max_steps", "3", "--data.init_args.loader.train_batches", "6", "--trainer.logger", "true"]
    done = run(command, tmp_path, cli_env())
    assert done.stdout.count("trainable parameters") == 1  # printed by rank 0 only
    assert done.stdout.count("effective batch size 16 tasks per step = 8 per rank x 2 ranks x 1 accumulated") == 1
    assert "epoch 6 global batches (3 per rank)" in done.stdout
    assert [p.name for p in (run_dir / "lightning_logs").iterdir()] == ["version_0"]  # one logger writes

    ranks = [read_records(records, rank) for rank in (0, 1)]
    train = [{r["task"] for r in recs if r["kind"] == "train"} for recs in ranks]
    assert len(train[0]) == len(train[1]) == 3 and not train[0] & train[1]
    val = [[r["task"] for r in recs if r["kind"] == "val"] for recs in ranks]
    union = union_metrics(run_dir / "checkpoints" / "last.ckpt", val_batches=3, batch_size=8)
    # Fingerprints are sums of GP draws, equal up to float rounding: the ranks run one torch thread each and the
    # test process may run several, which changes the Cholesky's summation order in the last bits.
    assert len(val[0]) == 2 and len(val[1]) == 1
    assert sorted(val[0] + val[1]) == pytest.approx(sorted(union["tasks"]), rel=1e-6)

    for recs in ranks:
        (metrics,) = [r["metrics"] for r in recs if r["kind"] == "val_metrics"]
        assert metrics["val/loglik"] == pytest.approx(union["val/loglik"], rel=1e-5, abs=1e-5)
        assert metrics["val/rmse"] == pytest.approx(union["val/rmse"], rel=1e-5)


def scontrol_stub(tmp_path: Path) -> tuple[Path, Path]:
    """A ``scontrol`` on PATH that records its arguments: ``(bin directory, calls file)``."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    stub.chmod(0o755)
    return bin_dir, calls


def test_slurm_sigusr1_saves_requeues_and_the_next_launch_resumes(tmp_path):
    """Under SLURM (environment variables set), SIGUSR1 makes the run finish its step, save last.ckpt, call
    ``scontrol requeue <job id>`` (a stub on PATH records the call) and stop; relaunching the same command resumes
    there. Lightning's own requeue handler (which would save hpc_ckpt_N.ckpt inside the handler) is off."""
    bin_dir, calls = scontrol_stub(tmp_path)
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "gridtnp-test",
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **slurm)
    run_dir, records = tmp_path / "run", tmp_path / "rec"
    command = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", pause_at_step=3, pause_seconds=4)
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for((records / "paused").exists, "the pause after step 3", proc)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGUSR1, err[-4000:]
    assert calls.read_text().split() == ["requeue", "4242"]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert "gridtnp: stopped by SIGUSR1 after step 4; saved " in err and "requeued Slurm job 4242" in err
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))

    resumed = run(command, tmp_path, env)
    assert f"resuming from {last} (global step 4)" in resumed.stdout
    steps = [r["step"] for r in read_records(records) if r["kind"] == "train"]
    assert steps == list(range(1, 13))  # nothing redone, nothing skipped


def signal_and_resume(tmp_path: Path, signum: int, *extra: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Signal a run during the pause before step 5, check it saved step 5 and exited 128 + signal, relaunch it."""
    env = cli_env()
    run_dir, records = tmp_path / "run", tmp_path / "rec"
    command = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", *extra)
    first = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", *extra, pause_at_step=4,
                        pause_seconds=3.0)  # fmt: skip
    proc = subprocess.Popen(first, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for((records / "paused").exists, "the pause before step 5", proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-4000:]
    name = signal.Signals(signum).name
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert f"gridtnp: stopped by {name} after step 5; saved {os.path.relpath(ckpt, tmp_path)}; resume with" in err
    assert torch.load(ckpt, weights_only=True)["global_step"] == 5
    resumed = run(command, tmp_path, env)
    # last.ckpt, or the end-of-epoch checkpoint of the same step (step 5 ends epoch 0 here)
    assert f"resuming from {run_dir / 'checkpoints'}" in resumed.stdout and "(global step 5)" in resumed.stdout
    return resumed, records, run_dir


@SLOW
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_save_the_step_reached_and_exit_non_zero(tmp_path, signum):
    """The step in progress finishes, last.ckpt holds it, the exit status is 128 + signal (not 0), and the relaunch
    trains on the same tasks with the same losses as an uninterrupted run (one thread: to 1e-6)."""
    reference = run(fit_command(tmp_path / "ref", tmp_path / "ref_rec"), tmp_path, cli_env())
    assert reference.returncode == 0
    _, records, run_dir = signal_and_resume(tmp_path, signum, "--trainer.logger", "true")
    # The relaunch logs on into the run's TensorBoard folder: one folder, one point per validation, none twice.
    assert [p.name for p in (run_dir / "lightning_logs").iterdir()] == ["version_0"]
    events = EventAccumulator(str(run_dir / "lightning_logs" / "version_0"))
    events.Reload()
    steps = [e.step for e in events.Scalars("val/loglik")]
    # The validation due after step 5 does not run on the way out (the signal asked to stop), nor on the resume,
    # which goes on to the next one, after step 10 (logged at index 9).
    assert steps == [9], steps
    expected, got = train_steps(tmp_path / "ref_rec"), train_steps(records)
    assert sorted(got) == sorted(expected) == list(range(1, 13))
    for step in expected:
        assert got[step]["task"] == expected[step]["task"], f"step {step} trained on other tasks"
        assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, (step, got[step], expected[step])


@SLOW
def test_sigterm_under_ddp_saves_one_step_on_every_rank(tmp_path):
    """Rank 0 alone is signalled; both ranks stop after the same step, which last.ckpt holds, and the relaunch on
    two processes goes on from there with the same tasks and losses (1e-6) as an uninterrupted 2-process run."""
    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    ddp += ["--data.init_args.loader.train_batches", "10"]  # epochs of 5 steps on each rank
    reference = run(fit_command(tmp_path / "ref", tmp_path / "ref_rec", *ddp), tmp_path, cli_env())
    assert reference.returncode == 0
    _, records, _ = signal_and_resume(tmp_path, signal.SIGTERM, *ddp)
    for rank in (0, 1):
        steps = [r["step"] for r in read_records(records, rank) if r["kind"] == "train"]
        assert steps == list(range(1, 13)), (rank, steps)  # nothing redone, nothing skipped, on both ranks
        expected, got = train_steps(tmp_path / "ref_rec", rank), train_steps(records, rank)
        for step in expected:  # the same tasks and losses as an uninterrupted 2-process run
            assert got[step]["task"] == pytest.approx(expected[step]["task"], rel=1e-9), (rank, step)
            assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, (rank, step, got[step], expected[step])


@SLOW
def test_sigusr1_outside_slurm_saves_and_training_goes_on(tmp_path):
    env = cli_env()
    run_dir, records = tmp_path / "run", tmp_path / "rec"
    command = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", pause_at_step=4, pause_seconds=3)
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for((records / "paused").exists, "the pause before step 5", proc)
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), "the save", proc)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-4000:]
    steps = [r["step"] for r in read_records(records) if r["kind"] == "train"]
    assert steps == list(range(1, 13))


@SLOW
def test_sighup_saves_as_sigterm_does(tmp_path):
    """Closing the terminal (SIGHUP) finishes the step, saves it, exits 128 + 1; the relaunch resumes there."""
    resumed, records, _ = signal_and_resume(tmp_path, signal.SIGHUP)
    assert [r["step"] for r in read_records(records) if r["kind"] == "train"] == list(range(1, 13))
    assert "gridtnp: fit done at step 12" in resumed.stdout


def slurm_ranks(
    tmp_path: Path, run_dir: Path, records: Path, world: int, bin_dir: Path, *extra: str, pause: int | None = None
) -> list[subprocess.Popen]:
    """``world`` processes of one emulated Slurm job step on this machine (``srun --ntasks=world``): Lightning's
    ``SLURMEnvironment`` reads the ranks from ``SLURM_PROCID`` and friends, as on a cluster."""
    procs = []
    for rank in range(world):
        slurm = {
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "gridtnp-test", "SLURM_NTASKS": str(world),
            "SLURM_NTASKS_PER_NODE": str(world), "SLURM_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0", "MASTER_PORT": "29531",
        }  # fmt: skip
        env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **slurm)
        ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", str(world), "--trainer.strategy", "ddp"]
        ddp += ["--data.init_args.loader.val_batches", str(max(3, world))]  # a validation batch for every rank
        ddp += ["--data.init_args.loader.train_batches", str(5 * world)]  # epochs of 5 steps on each rank
        command = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", *ddp, *extra,
                              pause_at_step=pause, pause_seconds=4.0)  # fmt: skip
        procs.append(subprocess.Popen(command, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))  # fmt: skip
    return procs


def finish(procs: list[subprocess.Popen], timeout: float, groups: bool = False) -> list[tuple[int, str, str]]:
    """Every process's exit status and output, within ``timeout`` seconds in all (a hang fails the test); the
    processes are killed after, with ``groups`` their whole process groups (a launch script and its training)."""
    deadline, results = time.monotonic() + timeout, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if not groups:
                proc.kill()
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return results


@pytest.mark.parametrize(
    ("world", "signalled"),
    [
        (2, "one"),
        pytest.param(2, "all", marks=SLOW),
        pytest.param(4, "one", marks=SLOW),
        pytest.param(4, "all", marks=SLOW),
    ],
)
def test_slurm_requeue_signal_under_ddp_saves_one_step_on_every_rank(tmp_path, world, signalled):
    """SIGUSR1 to one rank (the last) or to every rank of an emulated Slurm job step, in the middle of step 5: every
    rank finishes step 5, last.ckpt holds it, rank 0 requeues the job once, every rank exits 128 + SIGUSR1 in
    bounded time (no hang in a collective save); the relaunched job step resumes at step 6 on every rank."""
    bin_dir, calls = scontrol_stub(tmp_path)
    run_dir, records = tmp_path / "run", tmp_path / "rec"
    procs = slurm_ranks(tmp_path, run_dir, records, world, bin_dir, pause=4)
    wait_for((records / "paused").exists, "the pause before step 5", procs[0])
    for proc in procs if signalled == "all" else procs[-1:]:
        proc.send_signal(signal.SIGUSR1)
    results = finish(procs, timeout=180)
    for rank, (code, _, err) in enumerate(results):
        assert code == 128 + signal.SIGUSR1, (rank, err[-3000:])
    assert calls.read_text().split() == ["requeue", "4242"]
    assert "gridtnp: stopped by SIGUSR1 after step 5; saved " in results[0][2]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    for rank in range(world):
        assert [r["step"] for r in read_records(records, rank) if r["kind"] == "train"] == [1, 2, 3, 4, 5]

    results = finish(slurm_ranks(tmp_path, run_dir, records, world, bin_dir), timeout=240)
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, (rank, err[-3000:])
    assert "(global step 5)" in results[0][1]
    for rank in range(world):
        steps = [r["step"] for r in read_records(records, rank) if r["kind"] == "train"]
        assert steps == list(range(1, 13)), (rank, steps)


@SLOW
@pytest.mark.parametrize("signalled", ["one", "all"])
def test_sigterm_during_validation_under_ddp_stops_after_it_on_every_rank(tmp_path, signalled):
    """SIGTERM to rank 1 or to both ranks while they validate after step 5: the validation ends, both ranks save
    step 5 and exit 143 (none waits in a collective for the other), and the relaunch resumes at step 6."""
    run_dir, records, marks = tmp_path / "run", tmp_path / "rec", tmp_path / "marks"
    pause = {"class_path": "tests.training.pausing.Pause", "init_args": {"out": str(marks), "validation_at_step": 5,
             "seconds": 6.0}}  # fmt: skip
    callbacks = [{"class_path": "tests.recording.Record", "init_args": {"out": str(records)}}, pause]
    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    ddp += ["--data.init_args.loader.train_batches", "10"]  # epochs of 5 steps on each rank: validation after step 5
    command = fit_command(run_dir, records, "--checkpoint.last_every_n_steps", "100", *ddp)
    first = list(command)
    first[first.index("--trainer.callbacks") + 1] = json.dumps(callbacks)
    proc = subprocess.Popen(first, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    wait_for(lambda: (marks / "paused0").exists() and (marks / "paused1").exists(), "the validation pause", proc)
    ranks = [0, 1] if signalled == "all" else [1]
    for rank in ranks:
        os.kill(int((marks / f"pid{rank}").read_text()), signal.SIGTERM)
    ((code, _, err),) = finish([proc], timeout=120)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5
    assert "gridtnp: stopped by SIGTERM after step 5; saved " in err
    for rank in (0, 1):
        assert [r["step"] for r in read_records(records, rank) if r["kind"] == "train"] == [1, 2, 3, 4, 5]
        assert [r["step"] for r in read_records(records, rank) if r["kind"] == "val_metrics"] == [5]

    resumed = run(command, tmp_path, cli_env())
    assert "(global step 5)" in resumed.stdout
    for rank in (0, 1):
        steps = [r["step"] for r in read_records(records, rank) if r["kind"] == "train"]
        assert steps == list(range(1, 13)), (rank, steps)
