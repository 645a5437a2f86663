"""Fault-tolerant checkpoints in-process: atomic writes, corrupt-file detection, exact mid-epoch resume, RNG state."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from gridtnp.data.datamodules import ShardSampler, TrainTaskStream, _EpochLoader
from gridtnp.data.sections import from_flat_arguments
from gridtnp.registry import build_from_spec
from gridtnp.training.checkpointing import (
    AtomicCheckpointIO,
    Checkpoint,
    CheckpointError,
    previous_path,
    resume_checkpoint,
    verify_checkpoint,
)
from tests.recording import Record, read_records


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_atomic_io_keeps_the_previous_version_and_never_a_partial_file(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    assert torch.load(path)["global_step"] == 2
    assert torch.load(previous_path(path))["global_step"] == 1

    def crash(obj, f):  # the process dies half-way through writing
        f.write(b"PK\x03\x04partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 3}, path)
    assert torch.load(path)["global_step"] == 2  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.previous.ckpt"]  # no temporary left


def test_verify_detects_truncated_and_corrupt_files(tmp_path):
    path = tmp_path / "a.ckpt"
    torch.save({"w": torch.randn(1000)}, path)
    assert verify_checkpoint(path) is None
    flipped = bytearray(path.read_bytes())
    flipped[len(flipped) // 3] ^= 0xFF
    (tmp_path / "b.ckpt").write_bytes(bytes(flipped))
    assert "CRC" in verify_checkpoint(tmp_path / "b.ckpt")
    truncate(path)
    assert "truncated" in verify_checkpoint(path)
    (tmp_path / "c.ckpt").write_bytes(b"")
    assert verify_checkpoint(tmp_path / "c.ckpt") == "empty file"


class DrawRandom(L.Callback):
    """Consumes the global RNG at every step, as dropout would, and records the draw."""

    def __init__(self) -> None:
        self.draws: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.draws[trainer.global_step] = float(torch.rand(()))


def fit(tmp_path, name: str, max_steps: int, ckpt_path=None, ckpt_dir=None) -> tuple[L.Trainer, dict, DrawRandom]:
    L.seed_everything(0)
    data = from_flat_arguments(
        SyntheticDataModule, task={"name": "gp1d"}, batch_size=4, train_batches=5, val_batches=1, seed=3
    )
    module = NeuralProcessModule(preset="cnp", dim=16, lr=1e-2)
    draws = DrawRandom()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        callbacks=[
            Record(str(tmp_path / name)),
            draws,
            Checkpoint(dirpath=ckpt_dir, monitor="val/loglik", mode="max", save_last=True, last_every_n_steps=2),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data, ckpt_path=ckpt_path)
    steps = {r["step"]: r for r in read_records(tmp_path / name) if r["kind"] == "train"}
    return trainer, steps, draws


def test_truncated_last_checkpoint_is_skipped_and_training_resumes_exactly(tmp_path):
    """last.ckpt (step 4) truncated: resume from last.previous.ckpt (step 2, mid-epoch); steps 3-7 then see the
    same tasks, losses and RNG draws as an uninterrupted run."""
    _, expected, expected_draws = fit(tmp_path, "reference", max_steps=7)
    ckpt_dir = tmp_path / "ckpt"
    fit(tmp_path, "first", max_steps=4, ckpt_dir=ckpt_dir)
    last = ckpt_dir / "last.ckpt"
    assert torch.load(last)["global_step"] == 4
    truncate(last)
    with pytest.warns(UserWarning) as caught:  # every warning, so that the second is not raised again on exit
        path = resume_checkpoint("last", [ckpt_dir], tmp_path)
    assert path == previous_path(last)
    assert any(f"skipping checkpoint {last}: truncated" in str(w.message) for w in caught)
    assert any(f"resuming from the previous checkpoint {path} instead of {last}" in str(w.message) for w in caught)

    trainer, steps, draws = fit(tmp_path, "resumed", max_steps=7, ckpt_path=path, ckpt_dir=ckpt_dir)
    assert trainer.global_step == 7
    assert sorted(steps) == [3, 4, 5, 6, 7]
    for step, record in steps.items():
        assert record["task"] == expected[step]["task"], f"step {step} trained on other tasks"
        assert record["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6)
        assert draws.draws[step] == expected_draws.draws[step]


def test_no_readable_checkpoint_is_an_error_naming_the_files(tmp_path):
    (tmp_path / "last.ckpt").write_bytes(b"PK\x03\x04 not a whole archive")
    with pytest.warns(UserWarning, match="skipping checkpoint"), pytest.raises(CheckpointError, match=r"last\.ckpt"):
        resume_checkpoint("last", [tmp_path], None)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {tmp_path / 'last.ckpt'} is truncated")):
        resume_checkpoint(tmp_path / "last.ckpt", [], None)
    assert resume_checkpoint(None, [tmp_path / "absent"], None) is None  # nothing to resume: a fresh run


@pytest.mark.parametrize("num_workers", [0, 2])
def test_training_stream_resumes_after_the_consumed_batches(num_workers):
    task = build_from_spec("task", {"name": "gp1d"})
    consumed = {"n": 0}
    loader = _EpochLoader(TrainTaskStream(task, 2, 7, seed=1), lambda: 0, lambda: consumed["n"], batch_size=None)
    loader.num_workers = 0
    epoch0 = [b.target.y.sum() for b in loader]
    loader = _EpochLoader(
        TrainTaskStream(task, 2, 7, seed=1), lambda: 0, lambda: consumed["n"], batch_size=None, num_workers=num_workers
    )
    consumed["n"] = 3
    state = loader.state_dict()
    assert state == {"seed": 1, "epoch": 0, "consumed": 3, "num_batches": 7, "world_size": 1}
    loader.load_state_dict(state)
    torch.testing.assert_close(torch.stack([b.target.y.sum() for b in loader]), torch.stack(epoch0[3:]))
    loader.load_state_dict({**state, "consumed": 7})  # the epoch was complete: the next starts from its first batch
    next(iter(loader))
    assert (loader.dataset.epoch, loader.dataset.start) == (1, 0)


@pytest.mark.parametrize(("size", "world"), [(5, 2), (7, 3), (4, 4)])
def test_shard_sampler_covers_every_item_exactly_once(size, world):
    shards = [list(ShardSampler(range(size), world, rank)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    assert [len(ShardSampler(range(size), world, r)) for r in range(world)] == [len(s) for s in shards]


def test_cli_names_a_corrupt_checkpoint_without_a_traceback(tmp_path, capsys):
    from pathlib import Path

    from gridtnp.cli import main

    ckpt = tmp_path / "model.ckpt"
    torch.save({"global_step": 1}, ckpt)
    truncate(ckpt)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "gp1d_cnp.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", str(recipe), "--ckpt_path", str(ckpt), "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"gridtnp: error: checkpoint {ckpt} is truncated" in err and "Traceback" not in err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_separate_test_process_finds_the_best_checkpoint(tmp_path, capsys):
    """``gridtnp test --ckpt_path best --checkpoint.dirpath DIR`` tests what fit selected by val/loglik, not last."""
    import json
    from pathlib import Path

    from gridtnp.cli import main

    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "gp1d_cnp.yaml")
    ckpt_dir = tmp_path / "ckpt"
    common = ["--config", recipe, "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"]
    common += ["--checkpoint.dirpath", str(ckpt_dir), "--data.init_args.loader.batch_size", "4"]
    common += ["--model.init_args.variance_calibration", "true"]  # fitted at each validation, kept by the best
    main(["fit", *common, "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
          "--trainer.limit_val_batches", "2", "--plots.every_n_validations", "0"])  # fmt: skip
    state = next(v for v in torch.load(ckpt_dir / "last.ckpt", weights_only=True)["callbacks"].values()
                 if isinstance(v, dict) and "best_model_path" in v)  # fmt: skip
    best = Path(state["best_model_path"])
    assert best.parent == ckpt_dir.resolve() and best.name != "last.ckpt"
    capsys.readouterr()
    main(["test", *common, "--ckpt_path", "best", "--trainer.limit_test_batches", "2"])
    out = capsys.readouterr().out
    assert f"gridtnp: best checkpoint: {best} (val/loglik {float(state['best_model_score']):.4f})" in out
    record = json.loads(best.with_name(f"{best.stem}.test_metrics.json").read_text())
    assert record["checkpoint"] == str(best) and "loglik" in record["metrics"]
    state = torch.load(best, weights_only=True)["state_dict"]
    assert bool(state["std_scale_fitted"]) and float(state["std_scale"][0]) > 0
    assert record["metrics"]["calibration_scale"] == pytest.approx(float(state["std_scale"][0]))
    assert "uncalibrated/loglik" in record["metrics"] and "uncalibrated" in out.split("test/loglik")[0]
    with pytest.raises(SystemExit) as exit_info:  # without the directory: one line saying what to add
        main(["test", "--config", recipe, "--ckpt_path", "best", "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--ckpt_path best needs --checkpoint.dirpath DIR" in capsys.readouterr().err
