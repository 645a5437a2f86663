"""The Throughput callback: tasks per second consumed, the share of time waiting for data (validation taken out)
and its summary file, in a real fit.

The callback reads a clock that only the test moves (loading a batch, a step and a validation each take a set
time on it), so the shares it reports are exact whatever else runs on the machine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.training.throughput import Throughput
from tests.trainers import quiet_trainer

STEP = 0.01  # seconds a training step takes on the test's clock


class _Clock:
    """``time.perf_counter`` of the callback: moved only by ``advance``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _SlowData(SyntheticDataModule):
    """Training batches that take ``delay`` seconds (validation batches ``val_delay``) to draw on ``clock``."""

    delay = val_delay = 0.0
    clock: _Clock

    def train_dataloader(self):  # type: ignore[override]
        for batch in super().train_dataloader():
            self.clock.advance(self.delay)
            yield batch

    def val_dataloader(self):  # type: ignore[override]
        for batch in super().val_dataloader():
            self.clock.advance(self.val_delay)
            yield batch


class _Step(L.Callback):
    """Each training step takes ``STEP`` seconds on ``clock`` (after Throughput has noted its start)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def on_train_batch_start(self, *args, **kwargs) -> None:
        self.clock.advance(STEP)


def _fit(
    tmp_path,
    monkeypatch,
    delay: float,
    val_check_interval: int | None = None,
    max_steps: int = 12,
    ckpt_path: str | None = None,
) -> tuple[dict, L.Trainer]:
    L.seed_everything(0)
    clock = _Clock()
    monkeypatch.setattr("gridtnp.training.throughput.time", SimpleNamespace(perf_counter=clock))
    data = _SlowData(task={"name": "gp1d"}, loader={"batch_size": 4, "train_batches": 16, "val_batches": 2})
    data.delay, data.val_delay, data.clock = delay, 0.2, clock
    module = NeuralProcessModule(preset="cnp", dim=16)
    callback = Throughput(window=4, warmup=2, summary=str(tmp_path / "throughput.json"))
    trainer = quiet_trainer(
        max_steps=max_steps,
        limit_val_batches=2 if val_check_interval else 0,
        val_check_interval=val_check_interval,
        default_root_dir=tmp_path,
        callbacks=[callback, _Step(clock)],
    )
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return json.loads((tmp_path / "throughput.json").read_text()), trainer


def test_summary_counts_the_steps_after_warmup_and_the_wait_for_data(tmp_path, monkeypatch) -> None:
    fast, _ = _fit(tmp_path / "fast", monkeypatch, 0.0)
    slow, trainer = _fit(tmp_path / "slow", monkeypatch, 0.05)
    for summary in (fast, slow):
        assert summary["steps"] == 12 - 2 and summary["tasks"] == 4 * summary["steps"]
        assert summary["tasks_per_s"] == pytest.approx(summary["tasks"] / summary["seconds"], rel=0.02)
        assert summary["step_seconds"] == pytest.approx(STEP)
        assert "gpu_utilisation_mean" not in summary  # no GPU here: nothing sampled, nothing claimed
    # Ten measured steps: each waits for one 50 ms batch, then steps for 10 ms.
    assert fast["data_wait"] == 0 and fast["seconds"] == pytest.approx(10 * STEP)
    assert slow["seconds"] == pytest.approx(10 * (0.05 + STEP))
    assert slow["data_wait"] == pytest.approx(0.05 / (0.05 + STEP), abs=1e-3)
    assert torch.isfinite(trainer.callback_metrics["train/tasks_per_s"])


def test_validation_is_not_counted_as_waiting(tmp_path, monkeypatch) -> None:
    summary, _ = _fit(tmp_path, monkeypatch, 0.0, val_check_interval=4)  # 3 validations of 2 batches of 0.2 s
    assert summary["steps"] == 10
    assert summary["data_wait"] == 0 and summary["seconds"] == pytest.approx(10 * STEP)  # the 1.2 s taken out


def test_a_resumed_fit_measures_its_own_steps(tmp_path, monkeypatch) -> None:
    _, first = _fit(tmp_path / "first", monkeypatch, 0.0, max_steps=6)
    first.save_checkpoint(tmp_path / "six.ckpt")
    summary, resumed = _fit(tmp_path / "resumed", monkeypatch, 0.0, max_steps=12, ckpt_path=str(tmp_path / "six.ckpt"))
    assert resumed.global_step == 12
    assert summary["steps"] == 6 - 2 and summary["tasks"] == 4 * summary["steps"]  # warm-up counted from step 6


def test_bad_settings_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="window >= 1"):
        Throughput(window=0)
