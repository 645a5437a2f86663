"""The Throughput callback: tasks per second consumed, the share of time waiting for data (validation taken out)
and its summary file, in a real fit."""

from __future__ import annotations

import json
import time

import lightning as L
import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.training.throughput import Throughput
from tests.trainers import quiet_trainer


class _SlowData(SyntheticDataModule):
    """Training batches that take ``delay`` seconds to draw: a loader slower than the step."""

    delay = val_delay = 0.0

    def train_dataloader(self):  # type: ignore[override]
        for batch in super().train_dataloader():
            time.sleep(self.delay)
            yield batch

    def val_dataloader(self):  # type: ignore[override]
        for batch in super().val_dataloader():
            time.sleep(self.val_delay)
            yield batch


def _fit(
    tmp_path, delay: float, val_check_interval: int | None = None, max_steps: int = 12, ckpt_path: str | None = None
) -> tuple[dict, L.Trainer]:
    L.seed_everything(0)
    data = _SlowData(task={"name": "gp1d"}, batch_size=4, train_batches=16, val_batches=2)
    data.delay, data.val_delay = delay, 0.2
    module = NeuralProcessModule(preset="cnp", dim=16)
    callback = Throughput(window=4, warmup=2, summary=str(tmp_path / "throughput.json"))
    trainer = quiet_trainer(
        max_steps=max_steps,
        limit_val_batches=2 if val_check_interval else 0,
        val_check_interval=val_check_interval,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return json.loads((tmp_path / "throughput.json").read_text()), trainer


def test_summary_counts_the_steps_after_warmup_and_the_wait_for_data(tmp_path) -> None:
    fast, _ = _fit(tmp_path / "fast", 0.0)
    slow, trainer = _fit(tmp_path / "slow", 0.05)
    for summary in (fast, slow):
        assert summary["steps"] == 12 - 2 and summary["tasks"] == 4 * summary["steps"]
        assert summary["tasks_per_s"] == pytest.approx(summary["tasks"] / summary["seconds"], rel=0.02)
        assert "gpu_utilisation_mean" not in summary  # no GPU here: nothing sampled, nothing claimed
    # Each slow batch waits 50 ms before the step: at least 10 x 50 ms of the measured time is waiting for data.
    assert slow["data_wait"] * slow["seconds"] >= 0.9 * 10 * 0.05 and slow["data_wait"] > fast["data_wait"]
    assert torch.isfinite(trainer.callback_metrics["train/tasks_per_s"])


def test_validation_is_not_counted_as_waiting(tmp_path) -> None:
    summary, _ = _fit(tmp_path, 0.0, val_check_interval=4)  # 3 validations of 2 batches that sleep 0.2 s each
    assert summary["steps"] == 10
    # Counted as waiting, the validations alone would make it at least 1.2 s (sleeps are never shorter).
    assert summary["data_wait"] * summary["seconds"] < 3 * 2 * 0.2


def test_a_resumed_fit_measures_its_own_steps(tmp_path) -> None:
    _, first = _fit(tmp_path / "first", 0.0, max_steps=6)
    first.save_checkpoint(tmp_path / "six.ckpt")
    summary, resumed = _fit(tmp_path / "resumed", 0.0, max_steps=12, ckpt_path=str(tmp_path / "six.ckpt"))
    assert resumed.global_step == 12
    assert summary["steps"] == 6 - 2 and summary["tasks"] == 4 * summary["steps"]  # warm-up counted from step 6


def test_bad_settings_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="window >= 1"):
        Throughput(window=0)
