"""What ``gridtnp fit`` prints: a validation line in kelvin beside the coarse-cell baseline, the checkpoints and the
next commands at the end, a progress bar that keeps its total after a resume, option abbreviations refused."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gridtnp.cli.main import main
from gridtnp.training.progress import ResumingProgressBar
from gridtnp.training.summary import resume_command, validation_line

ROOT = Path(__file__).resolve().parents[2]


def test_validation_line_speaks_physical_units_beside_the_baseline():
    metrics = {
        "val/loglik": 0.5, "val/rmse": 0.2, "val/rmse_physical": 0.6, "val/heldout/rmse_physical": 0.41,
        "val/heldout/baseline_rmse_physical": 0.92, "val/heldout/coverage_90": 0.875, "val/coverage_90": 0.9,
    }  # fmt: skip
    line = validation_line(metrics, "K")
    assert line == "held-out RMSE 0.41 K (coarse cell 0.92 K), 90 % coverage 0.88, log-likelihood 0.500"
    # Without physical metrics (synthetic tasks): normalised units, said so.
    assert validation_line({"val/rmse": 1.2345, "val/coverage_90": 0.8}, None) == (
        "RMSE 1.23 (normalised units), 90 % coverage 0.80"
    )


def test_resume_command_replaces_the_checkpoint_option():
    argv = [
        "fit",
        "--config",
        "recipes/a b.yaml",
        "--ckpt_path",
        "old.ckpt",
        "--ckpt_path=x",
        "--trainer.max_steps",
        "9",
    ]
    assert resume_command(argv, "runs/x/last.ckpt") == (
        "gridtnp fit --config 'recipes/a b.yaml' --trainer.max_steps 9 --ckpt_path runs/x/last.ckpt"
    )


def test_progress_bar_keeps_its_total_and_epoch_after_a_mid_epoch_resume(capsys):
    progress = SimpleNamespace(current=SimpleNamespace(completed=3))
    fit_loop = SimpleNamespace(restarted_mid_epoch=True, epoch_loop=SimpleNamespace(batch_progress=progress))
    trainer = SimpleNamespace(
        fit_loop=fit_loop, current_epoch=2, num_training_batches=5, max_epochs=None, max_steps=12, global_step=13,
        is_global_zero=True,
    )  # fmt: skip
    bar = ResumingProgressBar()
    bar._trainer = trainer
    bar.on_train_start(trainer)
    assert bar.train_progress_bar.total == 5
    assert bar.train_progress_bar.n == 3
    assert bar.train_progress_bar.desc.startswith("Epoch 2")
    bar.train_progress_bar.close()


def test_an_abbreviated_option_is_refused_with_its_full_name(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(ROOT / "recipes" / "gp1d_cnp.yaml"), "--trainer.max_step", "30"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--trainer.max_step (did you mean --trainer.max_steps?)" in err


@pytest.mark.slow  # a 2-step ERA5 fit: about 30 s of CPU
def test_a_short_era5_fit_ends_with_its_checkpoints_and_a_kelvin_summary(tmp_path, capsys, monkeypatch):
    """Two steps of the station recipe on the embedded sample: each validation's line and the closing summary speak
    kelvin beside the coarse-cell baseline, and the output ends with the checkpoints and the next commands."""
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.chdir(tmp_path)
    main([
        "fit", "--config", str(ROOT / "recipes" / "era5_swin.yaml"), "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "2", "--trainer.default_root_dir", "run",
        "--checkpoint.dirpath", "run/ckpt", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        "--plots.every_n_validations", "0", "--trainer.num_sanity_val_steps", "0",
        "--data.init_args.splits.val", '["2019-03-22", "2019-03-22"]', "--data.init_args.task.eval_stride", "6",
    ])  # fmt: skip
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    step = next(line for line in lines if line.startswith("gridtnp: step 2: "))
    assert "RMSE " in step and " K (coarse cell " in step and "90 % coverage" in step
    tail = lines[lines.index("gridtnp: fit done at step 2") :]
    assert tail[1] == "  last checkpoint: run/ckpt/last.ckpt"
    assert tail[2].startswith("  best checkpoint: run/ckpt/") and "(step 2, val/loglik " in tail[2]
    assert tail[3].startswith("  best validation: ") and " K (coarse cell " in tail[3]
    assert tail[4].startswith("  test it:   gridtnp test --config run/ckpt/config.yaml --ckpt_path run/ckpt/")
    assert tail[5].startswith("  report it: gridtnp report --config run/ckpt/config.yaml --ckpt_path run/ckpt/")
    assert tail[5].endswith("--out report.html") and len(tail) == 6
    starting = [line for line in lines if line.endswith("...")]
    assert starting[:2] == ["gridtnp: building the model and the DataModule ...",
                            "gridtnp: setting up the data and the devices ..."]  # fmt: skip
