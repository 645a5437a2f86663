"""A real Slurm: ``recipes/slurm/fit_1node.sbatch`` submitted to slurmctld + slurmd on this machine, requeued with
``scontrol requeue`` mid-run, ends at the same step with the same losses as an uninterrupted run.

Needs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``make test-slow`` installs them) and root
(the daemons run as root, on local ports, for the test only); otherwise the test is skipped and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.recording import read_records

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A one-node Slurm cluster on localhost; yields the environment to talk to it."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        pytest.skip(f"Slurm is not installed here (missing {', '.join(missing)}; `make test-slow` installs it)")
    if os.geteuid() != 0:
        pytest.skip("the Slurm daemons of this test run as root")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "log", "munge"):
        (root / d).mkdir()
    host = socket.gethostname().split(".")[0]
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=gridtnptest",
                f"SlurmctldHost={host}(127.0.0.1)",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                f"AuthInfo=socket={socket_path}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "JobAcctGatherType=jobacct_gather/none",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=2000 State=UNKNOWN",
                f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            ]
        )
        + "\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = shutil.which("munged") or "/usr/sbin/munged"
    started = []
    try:
        subprocess.run(
            [munged, "--force", f"--key-file={key}", f"--socket={socket_path}", f"--pid-file={root / 'munged.pid'}",
             f"--log-file={root / 'log' / 'munged.log'}", f"--seed-file={root / 'munge' / 'seed'}"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        started.append(root / "munged.pid")
        for daemon in ("slurmctld", "slurmd"):
            path = shutil.which(daemon) or f"/usr/sbin/{daemon}"
            subprocess.run([path, "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
            started.append(root / f"{daemon}.pid")
        wait(lambda: "idle" in query(env, "sinfo", "-h", "-o", "%T"), "the node to come up", 60)
    except (subprocess.SubprocessError, AssertionError) as err:
        logs = "".join(p.read_text()[-1500:] for p in (root / "log").glob("*.log"))
        stop(started)
        pytest.skip(f"the Slurm daemons do not run in this sandbox ({err}); logs: {logs}")
    yield env
    stop(started)


def stop(pid_files: list[Path]) -> None:
    for pid_file in reversed(pid_files):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)


def query(env: dict[str, str], *command: str) -> str:
    """A Slurm client command's output."""
    return subprocess.run(list(command), env=env, capture_output=True, text=True).stdout.strip()


def fit_args(run_dir: Path, records: Path, pause_at_step: int | None = None, tasks: int = 1) -> list[str]:
    """The options after RECIPE RUN_DIR: a small CNP on 1-D GP tasks, on the CPU, ``tasks`` DDP ranks (epochs of 5
    steps on each), recording losses and tasks and logging the training loss at every step."""
    callback: dict = {"class_path": "tests.recording.Record", "init_args": {"out": str(records)}}
    if pause_at_step is not None:
        callback["init_args"].update(pause_at_step=pause_at_step, pause_seconds=8.0)
    return [
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.devices", str(tasks),
        "--model.init_args.dim", "32", "--trainer.max_steps", "12", "--data.init_args.loader.batch_size", "8",
        "--data.init_args.loader.train_batches", str(5 * tasks), "--data.init_args.loader.val_batches", "3",
        "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.log_every_n_steps", "1", "--trainer.callbacks", json.dumps([callback]),
    ]  # fmt: skip


def job_env(slurm: dict[str, str]) -> dict[str, str]:
    """The environment of ``sbatch`` and of the reference runs: this checkout's ``gridtnp`` and one torch thread."""
    return {
        **slurm,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "GRIDTNP_ALLOW_IMPORTS": "tests",
    }


def job_state(env: dict[str, str], job: str) -> str:
    """The job's state in ``squeue`` ("" once it has left the queue)."""
    return query(env, "squeue", "-h", "-j", job, "-o", "%T")


def relaunch(env: dict[str, str], job: str, folder: Path, pending: str, timeout: float) -> str:
    """Wait (``timeout`` s, described as ``pending``) for a requeued ``job`` to be pending, start it without the
    requeue delay, wait for it to finish and return its log (``job-*.out`` in ``folder``)."""
    wait(lambda: job_state(env, job) == "PENDING", pending, timeout)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env=env, check=True)
    wait(lambda: job_state(env, job) == "", "the relaunched job to finish", 600)
    return next(folder.glob("job-*.out")).read_text()


def test_requeued_sbatch_job_resumes_and_matches_an_uninterrupted_run(slurm, tmp_path):
    recipe = str(ROOT / "recipes" / "gp1d_cnp.yaml")
    env = job_env(slurm)
    reference = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", recipe, "--trainer.strategy", "ddp",
                 "--trainer.default_root_dir", str(tmp_path / "ref"),
                 *fit_args(tmp_path / "ref", tmp_path / "ref_rec")]  # fmt: skip
    done = subprocess.run(reference, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    run_dir, records = tmp_path / "run", tmp_path / "rec"
    submit = [
        "sbatch", "--parsable", "--gres=none", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=20",
        f"--output={tmp_path}/job-%j.out", str(ROOT / "recipes" / "slurm" / "fit_1node.sbatch"), recipe, str(run_dir),
        *fit_args(run_dir, records, pause_at_step=4),
    ]  # fmt: skip
    job = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    wait((records / "paused").exists, "the job to reach step 4", 300)
    subprocess.run(["scontrol", "requeue", job], env=env, check=True)

    log = relaunch(env, job, tmp_path, "the requeued job to be pending", 120)
    assert "gridtnp: stopped by SIGTERM after step 5; saved " in log
    assert "Exited with exit code 143" in log  # the scheduler sees an interrupted run, not a success
    assert "(global step 5)" in log and "resuming from" in log
    expected = {r["step"]: r for r in read_records(tmp_path / "ref_rec") if r["kind"] == "train"}
    got = {r["step"]: r for r in read_records(records) if r["kind"] == "train"}
    assert sorted(got) == sorted(expected) == list(range(1, 13))
    for step in expected:
        assert got[step]["task"] == expected[step]["task"], f"step {step} trained on other tasks"
        assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, (step, got[step], expected[step])


def test_requeue_signal_to_a_two_task_job_saves_one_step_and_its_loss_curve_continues(slurm, tmp_path):
    """``sbatch --ntasks=2`` on one node (2 CPU ranks, gloo) of ``fit_1node.sbatch``; SIGUSR1 to the job's tasks
    while they are in step 3 (``scancel --signal=USR1``: what ``--signal=SIGUSR1@90`` sends at the time limit).
    Both ranks finish step 3 and save it together (mid-epoch: no other checkpoint holds step 3), rank 0 requeues the
    job with the real ``scontrol requeue``, Slurm runs the template again, and it resumes at step 4 and ends at step
    12. Every rank trains on the same tasks with the same losses (1e-6) as an uninterrupted 2-process run, and the
    TensorBoard loss curve of the run directory has every step once, continuing from the saved step."""
    recipe = str(ROOT / "recipes" / "gp1d_cnp.yaml")
    env = job_env(slurm)
    reference = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", recipe, "--trainer.strategy", "ddp",
                 "--trainer.default_root_dir", str(tmp_path / "ref"), "--trainer.logger", "false",
                 *fit_args(tmp_path / "ref", tmp_path / "ref_rec", tasks=2)]  # fmt: skip
    done = subprocess.run(reference, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    run_dir, records = tmp_path / "run", tmp_path / "rec"
    submit = [
        "sbatch", "--parsable", "--gres=none", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
        "--time=20", f"--output={tmp_path}/job-%j.out", str(ROOT / "recipes" / "slurm" / "fit_1node.sbatch"), recipe,
        str(run_dir), *fit_args(run_dir, records, pause_at_step=2, tasks=2),
    ]  # fmt: skip
    job = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    wait((records / "paused").exists, "the job to reach step 2", 300)
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)  # the job step's tasks, not the shell
    # Only gridtnp's `scontrol requeue` puts the job back in the queue: the signal alone does not.
    log = relaunch(env, job, tmp_path, "the job to requeue itself", 180)
    assert "x 2 ranks x 1 accumulated (1 node(s) x 2 device(s)" in log
    # Slurm sends SIGTERM to the tasks of a requeued job while they exit; it is ignored from the requeue on, so the
    # run's last line is printed.
    assert "gridtnp: stopped by SIGUSR1 after step 3; saved " in log and f"requeued Slurm job {job}" in log
    assert "(global step 3)" in log and "resuming from" in log and "gridtnp: fit done at step 12" in log
    assert "Restarts=1" in query(env, "scontrol", "show", "job", job)
    for rank in (0, 1):
        expected = {r["step"]: r for r in read_records(tmp_path / "ref_rec", rank) if r["kind"] == "train"}
        steps = [r["step"] for r in read_records(records, rank) if r["kind"] == "train"]
        assert steps == list(range(1, 13)), (rank, steps)  # nothing redone, nothing skipped
        for r in read_records(records, rank):
            if r["kind"] == "train":
                assert r["task"] == pytest.approx(expected[r["step"]]["task"], rel=1e-9), (rank, r["step"])
                assert abs(r["loss"] - expected[r["step"]]["loss"]) <= 1e-6, (rank, r, expected[r["step"]])
    events = EventAccumulator(str(run_dir / "lightning_logs" / "version_0"))
    events.Reload()
    curve = events.Scalars("train/loss")  # logged by rank 0 at step index 0..11, from both segments of the job
    assert [e.step for e in curve] == list(range(12))
    expected = {r["step"]: r["loss"] for r in read_records(tmp_path / "ref_rec") if r["kind"] == "train"}
    assert [e.value for e in curve] == pytest.approx([expected[step] for step in range(1, 13)], abs=1e-6)
