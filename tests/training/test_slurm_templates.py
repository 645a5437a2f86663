"""The Slurm templates (``recipes/slurm/*.sbatch``) without Slurm: their ``#SBATCH`` defaults agree with each other,
and the ``srun`` line they run takes GPUs per node and loader workers from the allocation (a stub ``srun`` on PATH
records it), giving each rank its workers + 1 cores."""

from __future__ import annotations

import os
import re
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((ROOT / "recipes" / "slurm").glob("*.sbatch"))


def directives(template: Path) -> dict[str, str]:
    """The template's ``#SBATCH --key=value`` lines as ``{key: value}``."""
    found = re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", template.read_text(), flags=re.MULTILINE)
    return {key: value for key, value in found}


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_defaults_give_one_task_per_gpu_and_a_core_beside_the_workers(template):
    lines = directives(template)
    assert lines["gres"] == f"gpu:{lines['ntasks-per-node']}"
    assert int(lines["cpus-per-task"]) == 9  # the recipes' 8 loader workers + the training process


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_srun_takes_gpus_per_node_and_workers_from_the_allocation(template, tmp_path):
    calls = tmp_path / "srun_args.txt"
    stub = tmp_path / "srun"
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "{calls}"\n')
    stub.chmod(0o755)
    slurm = {"SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "7"}
    env = {**os.environ, **slurm, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    command = ["bash", str(template), "recipe.yaml", "runs/x", "--trainer.max_steps", "10"]
    subprocess.run(command, env=env, cwd=tmp_path, check=True, timeout=60)
    args = calls.read_text().split("\n")[:-1]
    assert args[:3] == ["--cpus-per-task=7", "gridtnp", "fit"]  # srun asks for the cores again (Slurm >= 22.05)
    pairs = dict(pairwise(args))
    assert pairs["--trainer.devices"] == "8" and pairs["--trainer.num_nodes"] == "2"
    assert pairs["--data.init_args.loader.num_workers"] == "6"  # 7 cores: the training process and 6 workers
    assert args[-2:] == ["--trainer.max_steps", "10"]  # the caller's options come last and override
