"""A run means the same at any world size: the learning rate scaled with the global batch (``lr_scaling``), epochs of
``train_batches`` global batches, and a validation set (and its ``limit_val_batches``) that is the same tasks on 1, 2
or 4 gloo CPU ranks, with metrics reduced over the union.

The multi-rank validations run ``tests.training.validate_ranks`` in a subprocess (one CLI-free start-up per rank,
30-70 s on 2 busy cores) with a hard timeout, so that a hang fails the test; two ranks in the default suite, four
``slow``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.data.datamodules import TrainTaskStream, _EpochLoader, generator_from
from gridtnp.data.eval_limits import limit_globally
from gridtnp.registry import ConfigError, build_from_spec
from gridtnp.training.lr_scaling import LrScaling
from gridtnp.training.run_scale import report_training_scale
from tests.recording import fingerprint
from tests.trainers import quiet_trainer
from tests.training.validate_ranks import DATA
from tests.training.validate_ranks import main as validate_on_ranks

ROOT = Path(__file__).resolve().parents[2]
MODEL = {
    "dim_x": 1, "dim_y": 1, "dim": 16, "encoder": {"name": "mlp", "layers": 2}, "grid_encoder": {"name": "identity"},
    "processor": {"name": "mean"}, "grid_decoder": {"name": "concat", "layers": 2}, "likelihood": {"name": "gaussian"},
}  # fmt: skip


def stream_epoch(world: int, epoch: int = 1, num_batches: int = 5) -> list[list[float]]:
    """Each rank's batch fingerprints of one epoch of a 1-D GP training stream shared by ``world`` ranks."""
    task = build_from_spec("task", {"name": "gp1d", "max_context": 6, "num_targets": 6})
    ranks = []
    for rank in range(world):
        stream = TrainTaskStream(task, 2, num_batches, seed=4, rank=rank, world_size=world)
        stream.set_epoch(epoch)
        ranks.append([fingerprint(b) for b in stream])
    return ranks


def test_an_epoch_is_the_same_global_batches_at_any_world_size():
    """One rank draws batch ``i`` from ``(seed, "train", 0, epoch, i)`` as before epochs were shared; ``n`` ranks
    share those batches (rank ``r``: ``r, r + n, ...``), completing the last round with the next global batches."""
    task = build_from_spec("task", {"name": "gp1d", "max_context": 6, "num_targets": 6})
    (single,) = stream_epoch(1)
    assert single == [fingerprint(task.sample(2, generator_from(4, "train", 0, 1, i))) for i in range(5)]
    (six,) = stream_epoch(1, num_batches=6)
    for world in (2, 3, 4):
        ranks = stream_epoch(world)
        per_rank = -(-5 // world)
        assert [len(r) for r in ranks] == [per_rank] * world  # the ranks step together
        drawn = [ranks[g % world][g // world] for g in range(per_rank * world)]
        assert drawn[:5] == single and len(set(drawn)) == len(drawn)
        if world == 2:
            assert drawn == six
    assert stream_epoch(2, epoch=2) != stream_epoch(2, epoch=1)


def test_a_stream_resumed_at_another_world_size_goes_on_after_the_consumed_global_batches():
    task = build_from_spec("task", {"name": "gp1d"})
    saved = _EpochLoader(TrainTaskStream(task, 2, 8, seed=1, world_size=2), lambda: 0, lambda: 2, batch_size=None)
    state = saved.state_dict()
    assert state == {"seed": 1, "epoch": 0, "consumed": 2, "num_batches": 8, "world_size": 2}
    resumed = _EpochLoader(TrainTaskStream(task, 2, 8, seed=1, rank=0, world_size=4), lambda: 0, batch_size=None)
    resumed.load_state_dict(state)
    batches = list(resumed)  # global batches 0-3 were consumed: rank 0 of 4 goes on with global batch 4
    assert len(batches) == 1
    assert fingerprint(batches[0]) == fingerprint(task.sample(2, generator_from(1, "train", 0, 0, 4)))
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 ranks"):
        TrainTaskStream(task, 2, 8, rank=2, world_size=2)


def test_evaluation_limits_count_global_batches():
    data = list(range(7))
    trainer = SimpleNamespace(testing=False, predicting=False, limit_val_batches=5, limit_test_batches=1.0)
    assert list(limit_globally(data, trainer, {})) == [0, 1, 2, 3, 4]
    assert limit_globally(data, SimpleNamespace(limit_val_batches=1.0), {}) is data
    assert list(limit_globally(data, SimpleNamespace(limit_val_batches=1), {})) == [0]
    assert limit_globally(data, None, {}) is data
    taken: dict[str, float] = {}
    trainer.limit_val_batches = 0.75
    assert list(limit_globally(data, trainer, taken)) == [0, 1, 2, 3, 4]  # int(7 x 0.75)
    assert trainer.limit_val_batches == 1.0 and taken == {"val": 0.75}  # Lightning must not cut each shard again
    assert list(limit_globally(data, trainer, taken)) == [0, 1, 2, 3, 4]  # the next request keeps the fraction
    trainer.testing = True
    assert limit_globally(data, trainer, taken) is data
    with pytest.raises(ConfigError, match=r"limit_val_batches 0\.1 keeps none of the 7 batches"):
        limit_globally(data, SimpleNamespace(limit_val_batches=0.1), {})


def test_lr_scaling_rules_and_errors():
    assert LrScaling.of(None).lr(1e-3, 64) == 1e-3
    assert LrScaling.of({"rule": "linear", "base_batch": 8}).lr(1e-3, 64) == pytest.approx(8e-3)
    assert LrScaling.of({"rule": "sqrt", "base_batch": 16}).lr(1e-3, 64) == pytest.approx(2e-3)
    with pytest.raises(ConfigError, match="needs base_batch"):
        LrScaling.of({"rule": "linear"})
    with pytest.raises(ConfigError, match="must be one of none, linear, sqrt"):
        LrScaling.of({"rule": "square", "base_batch": 8})
    with pytest.raises(ConfigError, match="unknown key"):
        LrScaling.of({"rule": "linear", "base": 8})
    with pytest.raises(ConfigError, match="no batch_size"):
        LrScaling.of({"rule": "sqrt", "base_batch": 8}).lr(1e-3, None)


def test_start_line_states_the_effective_batch_the_scaled_lr_and_the_epoch(capsys):
    trainer = SimpleNamespace(world_size=4, num_nodes=1, num_devices=4, accumulate_grad_batches=2,
                              precision="32-true", is_global_zero=True, loggers=[])  # fmt: skip
    scaling = LrScaling.of({"rule": "linear", "base_batch": 8})
    scale = report_training_scale(trainer, 5e-4, 8, scaling, train_batches=10)
    line = capsys.readouterr().out
    assert "effective batch size 64 tasks per step = 8 per rank x 4 ranks x 2 accumulated" in line
    assert "learning rate 0.004 = 0.0005 x 64/8 (linear lr_scaling, base batch 8)" in line
    assert "epoch 10 global batches (3 per rank)" in line
    assert scale["lr"] == pytest.approx(4e-3) and scale["train_batches_per_rank"] == 3


def test_the_warm_up_climbs_to_the_scaled_learning_rate():
    """Batch 4 x 2 accumulated = 8 tasks a step, base batch 2, sqrt rule: lr x 2, reached after the warm-up."""
    module = NeuralProcessModule(**MODEL, lr=1e-3, warmup_steps=2, lr_scaling={"rule": "sqrt", "base_batch": 2})
    trainer = quiet_trainer(max_steps=3, accumulate_grad_batches=2, limit_val_batches=0)
    trainer.fit(module, SyntheticDataModule(**DATA))
    group = trainer.optimizers[0].param_groups[0]
    assert group["initial_lr"] == pytest.approx(2e-3) and group["lr"] == pytest.approx(2e-3)
    assert module.run_lr == pytest.approx(2e-3)


def validate_in_subprocess(ckpt: Path, out: Path, world: int, limit: str | None, timeout: float) -> None:
    """``world`` ranks validating ``ckpt`` (Lightning starts ranks 1.. from the same command); the whole process
    group is killed when ``timeout`` seconds pass, so that a hang fails the test."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "tests.training.validate_ranks", str(ckpt), str(out), str(world)]
    proc = subprocess.Popen(command + ([limit] if limit else []), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"validation on {world} ranks did not finish within {timeout:.0f} s (a hang?)") from None
    assert proc.returncode == 0, err[-4000:]


@pytest.mark.parametrize(
    ("world", "limit"),
    [
        pytest.param(2, "5", marks=pytest.mark.slow),
        pytest.param(4, None, marks=pytest.mark.slow),
        pytest.param(4, "0.75", marks=pytest.mark.slow),
    ],
)
def test_validation_metrics_of_one_checkpoint_are_the_same_at_any_world_size(tmp_path, world, limit):
    """7 validation batches (``limit_val_batches``: 5, or 0.75 of 7: the first 5): the ranks evaluate each batch
    of the one-rank run exactly once, and the metrics reduced over ranks equal the one-rank metrics (1e-5: the
    sums are added in another order)."""
    module = NeuralProcessModule(**MODEL)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(module, SyntheticDataModule(**DATA))
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)

    limit_value = None if limit is None else (float(limit) if "." in limit else int(limit))
    validate_on_ranks(str(ckpt), str(tmp_path / "one"), 1, limit_value)
    one = json.loads((tmp_path / "one" / "rank0.json").read_text())
    assert len(one["tasks"]) == (7 if limit is None else 5)
    validate_in_subprocess(ckpt, tmp_path / "many", world, limit, timeout=300)
    ranks = [json.loads((tmp_path / "many" / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["world_size"] for r in ranks] == [world] * world
    seen = [task for r in ranks for task in r["tasks"]]
    assert sorted(seen) == pytest.approx(sorted(one["tasks"]), rel=1e-6)  # each batch once: no duplicate, no drop
    many = ranks[0]["metrics"]
    assert sorted(many) == sorted(one["metrics"]) and "val/loglik" in many
    for name, value in one["metrics"].items():
        assert many[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert torch.isfinite(torch.tensor(list(many.values()))).all()
