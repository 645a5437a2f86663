"""Two node launches of ``recipes/slurm/fit_multinode.sbatch`` on this machine (2 nodes x 1 CPU task, gloo): the
template runs once per node with that node's Slurm variables and a stub ``srun`` that starts the node's one task in
place, as ``srun`` does on each node of a job step; Lightning's ``SLURMEnvironment`` takes the ranks from
``SLURM_PROCID`` / ``SLURM_NODEID`` and the rendezvous from ``SLURM_NODELIST`` (localhost) and ``MASTER_PORT``.

SIGUSR1 to node 1's process in the middle of step 5: both nodes save step 5, node 0 requeues the job (a stub
``scontrol`` records it), both stop; the two relaunched node launches resume to step 12, and the final weights equal
those of one launch of two processes on one node (``--trainer.devices 2``) run straight to step 12.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.recording import read_records
from tests.training.test_scaleout import cli_env, finish, scontrol_stub, train_steps

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "gp1d_cnp.yaml")
TEMPLATE = str(ROOT / "recipes" / "slurm" / "fit_multinode.sbatch")
NODES, MAX_STEPS = 2, 12
pytestmark = pytest.mark.slow  # three launches of two processes each: about a minute on two cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def srun_stub(bin_dir: Path, pids: Path) -> None:
    """An ``srun`` on PATH that drops its options, writes its process id to ``{pids}/node{SLURM_NODEID}`` and
    becomes the task (``exec``), so the test can signal one node's training process."""
    pids.mkdir()
    stub = bin_dir / "srun"
    drop_options = 'while [ "${1#--}" != "$1" ]; do shift; done'
    stub.write_text(f'#!/bin/sh\n{drop_options}\necho $$ > "{pids}/node$SLURM_NODEID"\nexec "$@"\n')
    stub.chmod(0o755)


def options(records: Path, pause_at_step: int | None = None) -> list[str]:
    """``gridtnp fit`` options of a small CNP on 1-D GP tasks on the CPU (epochs of 5 steps on each of 2 ranks),
    recording losses and tasks; the template takes them after RECIPE RUN_DIR and they override its GPU options."""
    callback: dict = {"class_path": "tests.recording.Record", "init_args": {"out": str(records)}}
    if pause_at_step is not None:
        callback["init_args"].update(pause_at_step=pause_at_step, pause_seconds=8.0)
    return [
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--model.init_args.dim", "32",
        "--trainer.max_steps", str(MAX_STEPS), "--checkpoint.last_every_n_steps", "100",
        "--data.init_args.loader.batch_size", "8", "--data.init_args.loader.train_batches", "10",
        "--data.init_args.loader.val_batches", "3", "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks", json.dumps([callback]),
    ]  # fmt: skip


def node_launches(tmp_path: Path, run_dir: Path, records: Path, port: int, **pause) -> list[subprocess.Popen]:
    """The template started once per node with that node's Slurm variables (``sbatch --nodes=2
    --ntasks-per-node=1 --cpus-per-task=1``), each in its own process group."""
    bin_dir = tmp_path / "bin"
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    procs = []
    for node in range(NODES):
        slurm = {
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "gridtnp-multi", "SLURM_NTASKS": str(NODES),
            "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NUM_NODES": str(NODES), "SLURM_NNODES": str(NODES),
            "SLURM_NODELIST": "localhost", "SLURM_CPUS_PER_TASK": "1", "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0", "SLURM_NODEID": str(node), "MASTER_PORT": str(port),
        }  # fmt: skip
        command = ["bash", TEMPLATE, RECIPE, str(run_dir), *options(records, **pause)]
        env = cli_env(PATH=path, **slurm)
        procs.append(subprocess.Popen(command, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True))  # fmt: skip
    return procs


def wait_for(path: Path, what: str, procs: list[subprocess.Popen], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            results = finish(procs, timeout=1.0, groups=True)
            raise AssertionError(f"no {what}: {[(code, err[-2000:]) for code, _, err in results]}")
        time.sleep(0.2)


def test_two_node_launches_requeue_resume_and_match_one_launch_of_two_processes(tmp_path):
    bin_dir, calls = scontrol_stub(tmp_path)
    srun_stub(bin_dir, tmp_path / "pids")
    reference = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", RECIPE, "--trainer.devices", "2",
                 "--trainer.num_nodes", "1", "--trainer.strategy", "ddp", "--trainer.logger", "false",
                 "--trainer.default_root_dir", str(tmp_path / "ref"),
                 "--checkpoint.dirpath", str(tmp_path / "ref" / "checkpoints"),
                 *options(tmp_path / "ref_rec")]  # fmt: skip
    ref = subprocess.Popen(reference, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip

    run_dir, records = tmp_path / "run", tmp_path / "rec"
    nodes = node_launches(tmp_path, run_dir, records, free_port(), pause_at_step=4)
    wait_for(records / "paused", "pause before step 5", nodes)
    os.kill(int((tmp_path / "pids" / "node1").read_text()), signal.SIGUSR1)  # node 1's task only, mid-step
    results = finish(nodes, timeout=180, groups=True)
    for node, (code, _, err) in enumerate(results):
        assert code == 128 + signal.SIGUSR1, (node, err[-3000:])  # the template's shell passes the status on
    assert "x 2 ranks x 1 accumulated (2 node(s) x 1 device(s)" in results[0][1]
    assert "gridtnp: stopped by SIGUSR1 after step 5; saved " in results[0][2]
    assert calls.read_text().split() == ["requeue", "4242"]  # once, by global rank 0
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    for rank in range(NODES):
        assert [r["step"] for r in read_records(records, rank) if r["kind"] == "train"] == [1, 2, 3, 4, 5]

    results = finish(node_launches(tmp_path, run_dir, records, free_port()), timeout=240, groups=True)
    for node, (code, _, err) in enumerate(results):
        assert code == 0, (node, err[-3000:])
    assert f"resuming from {run_dir / 'checkpoints'}" in results[0][1] and "(global step 5)" in results[0][1]
    ((code, _, err),) = finish([ref], timeout=240, groups=True)
    assert code == 0, err[-3000:]

    got = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    expected = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=True)
    assert got["global_step"] == expected["global_step"] == MAX_STEPS
    assert got["state_dict"].keys() == expected["state_dict"].keys()
    for name, weight in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], weight), name
    for rank in range(NODES):  # every rank's loss curve goes on from step 6, as the one launch's does
        steps, ref_steps = train_steps(records, rank), train_steps(tmp_path / "ref_rec", rank)
        assert [r["step"] for r in read_records(records, rank) if r["kind"] == "train"] == list(range(1, 13))
        for step, r in ref_steps.items():
            assert steps[step]["task"] == pytest.approx(r["task"], rel=1e-9), (rank, step)
            assert abs(steps[step]["loss"] - r["loss"]) <= 1e-6, (rank, step, steps[step], r)
