"""End to end: a tiny model learns, and the CLI trains from a recipe in a subprocess."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from gridtnp import NeuralProcessModule
from gridtnp.cli import GridTNPCLI, main
from gridtnp.data import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.registry import ConfigError
from tests.trainers import quiet_trainer

ROOT = Path(__file__).resolve().parents[2]


def mean_val_loglik(module: NeuralProcessModule, data: SyntheticDataModule) -> float:
    module.eval()
    with torch.no_grad():
        values = [log_likelihood(module(b), b.target.y, b.target.valid()).mean() for b in data.val_dataloader()]
    return float(torch.stack(values).mean())


def test_tiny_tnp_learns_1d_gp(tmp_path):
    L.seed_everything(0)
    data = from_flat_arguments(
        SyntheticDataModule, task={"name": "gp1d"}, batch_size=16, train_batches=60, val_batches=4, seed=1
    )
    data.setup("fit")
    module = NeuralProcessModule(preset="tnp", dim=32, lr=1e-3, processor={"layers": 2})
    before = mean_val_loglik(module, data)
    module.train()  # back from the evaluation above, as a fit starts
    trainer = quiet_trainer(max_steps=60, gradient_clip_val=0.5, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(module, data)
    after = mean_val_loglik(module, data)
    # 60 steps gain 0.23 nats (-1.42 -> -1.18) with the paper's two-hidden-layer head and k_pe periodic tasks
    # (0.3 with the old one-hidden-layer head and standard periodic kernel); an untrained model gains nothing.
    assert after > before + 0.2, (before, after)


def test_validation_metrics_are_logged():
    data = from_flat_arguments(
        SyntheticDataModule, task={"name": "gp1d"}, batch_size=8, train_batches=2, val_batches=2, test_batches=2
    )
    module = NeuralProcessModule(preset="cnp", dim=16)
    trainer = quiet_trainer()
    (metrics,) = trainer.test(module, data, verbose=False)
    assert {"test/loglik", "test/rmse", "test/oracle_loglik"} <= set(metrics)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["test/oracle_loglik"] > metrics["test/loglik"]  # an untrained CNP is worse than the true GP


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "gridtnp.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_fit_then_test_from_recipe(tmp_path):
    recipe = ROOT / "recipes" / "gp1d_cnp.yaml"
    common = [
        "--config",
        str(recipe),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--data.init_args.loader.val_batches",
        "2",
        "--data.init_args.loader.test_batches",
        "2",
    ]
    fit = run_cli(
        "fit", *common, "--trainer.max_steps", "8", "--data.init_args.loader.train_batches", "4", cwd=tmp_path
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "trainable parameters" in fit.stdout
    last = next(tmp_path.rglob("last.ckpt"))
    test = run_cli("test", *common, "--ckpt_path", str(last), cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-3000:]
    assert "test/loglik" in test.stdout
    record = json.loads((last.parent / "last.test_metrics.json").read_text())
    assert record["checkpoint"] == str(last) and record["config"] == [str(recipe)]
    metrics = record["metrics"]
    assert {"loglik", "loglik_stderr", "rmse", "crps", "coverage_90", "oracle_loglik"} <= set(metrics)
    assert f"test/crps  {metrics['crps']:.4f}".split() == next(
        line.split() for line in test.stdout.splitlines() if line.startswith("test/crps ")
    )
    assert list(tmp_path.rglob("events.out.tfevents*")), "TensorBoard logs were not written"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--model.init_args.processor", "{name: transfomer}"], "Did you mean 'transformer'"),
        (["--model.init_args.processor", "{name: mean, layers: 2}"], "processor 'mean' got unknown argument(s)"),
        (["--model.init_args.procesor", "{name: mean}"], "procesor"),
    ],
)
def test_cli_reports_config_errors(tmp_path, capsys, override, message):
    recipe = ROOT / "recipes" / "gp1d_cnp.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(recipe), *override, "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cli_list(capsys):
    main(["list", "processor"])
    out = capsys.readouterr().out
    assert "transformer" in out and "unet" in out and "Full MHSA" in out
    with pytest.raises(SystemExit):
        main(["list", "procesor"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_recipe_instantiates_through_the_cli(recipe, tmp_path):
    cli = GridTNPCLI(
        run=False,
        args=["--config", str(recipe), "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"],
    )
    assert isinstance(cli.model, NeuralProcessModule)
    assert cli.model.num_parameters > 0
    assert cli.trainer.gradient_clip_val == 0.5
    assert isinstance(cli.datamodule, L.LightningDataModule)


RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SYNTHETIC_RECIPES = [
    p for p in RECIPES if yaml.safe_load(p.read_text())["data"].get("class_path") == "gridtnp.data.SyntheticDataModule"
]


@pytest.mark.parametrize("recipe", SYNTHETIC_RECIPES, ids=lambda p: p.stem)
def test_every_synthetic_recipe_builds_and_runs_a_batch(recipe):
    from gridtnp.registry import build_from_spec

    config = yaml.safe_load(recipe.read_text())
    module = NeuralProcessModule(**config["model"]["init_args"])
    task_spec = config["data"]["init_args"]["task"]
    if task_spec["name"] == "gp2d":  # 1,000 of the 10,000 context points: the same code paths, a tenth of the time
        task_spec = {**task_spec, "num_context": 1_000}
    task = build_from_spec("task", task_spec)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    loss = -log_likelihood(module(batch), batch.target.y, batch.target.valid()).mean()
    loss.backward()
    assert torch.isfinite(loss)


def test_last_checkpoint_holds_the_final_weights(tmp_path):
    """With a monitored best checkpoint, last.ckpt must still be the newest model, not the best one."""
    from gridtnp.training.checkpointing import Checkpoint

    L.seed_everything(0)
    data = from_flat_arguments(SyntheticDataModule, task={"name": "gp1d"}, batch_size=4, train_batches=2, val_batches=1)
    # With this seed and learning rate the validation log-likelihood falls at every epoch, so the first model
    # stays "best" and Lightning's own ModelCheckpoint would leave last.ckpt at step 2.
    module = NeuralProcessModule(preset="cnp", dim=16, lr=1e-2)
    ckpt = Checkpoint(dirpath=tmp_path, monitor="val/loglik", mode="max", save_last=True)
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        callbacks=[ckpt],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, data)
    assert ckpt.best_model_path.endswith("step=2.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt", "last.previous.ckpt"]
    last = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert last["global_step"] == 6
    assert torch.load(tmp_path / "last.previous.ckpt", weights_only=False)["global_step"] == 4
    final = {k: v for k, v in module.state_dict().items()}
    for key, value in last["state_dict"].items():
        torch.testing.assert_close(value, final[key])


def test_cosine_schedule_warms_up_then_decays_to_zero_at_max_steps():
    module = NeuralProcessModule(preset="cnp", dim_x=1, dim_y=1, lr=1e-3, warmup_steps=10, lr_schedule="cosine")
    module.trainer = L.Trainer(max_steps=110, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    config = module.configure_optimizers()
    optimiser, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(111):
        rates.append(optimiser.param_groups[0]["lr"])
        optimiser.step()
        scheduler.step()
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)  # linear warm-up over 10 steps
    assert rates[60] == pytest.approx(0.5e-3) and rates[110] == pytest.approx(0.0, abs=1e-12)  # half-way, end
    assert all(a >= b for a, b in itertools.pairwise(rates[9:]))
    with pytest.raises(ConfigError, match="lr_schedule"):
        NeuralProcessModule(preset="cnp", dim_x=1, dim_y=1, lr_schedule="linear")


def test_cosine_schedule_follows_the_time_budget_when_max_time_stops_the_run_first(capsys):
    """max_time and cosine agree: the decay follows elapsed / max_time (or max_steps, whichever is further on)."""
    from lightning.pytorch.callbacks import Timer

    module = NeuralProcessModule(preset="cnp", dim_x=1, dim_y=1, lr=1e-3, warmup_steps=2, lr_schedule="cosine")
    for max_steps in (-1, 1000):  # no step bound, and a step bound the time budget cuts long before
        module.trainer = L.Trainer(
            max_time={"seconds": 100}, max_steps=max_steps, logger=False, enable_checkpointing=False
        )
        timer = next(cb for cb in module.trainer.callbacks if isinstance(cb, Timer))
        elapsed = [0.0]
        timer.time_elapsed = lambda stage="train", clock=elapsed: clock[0]
        config = module.configure_optimizers()
        optimiser, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
        rates = {}
        for step in range(12):
            elapsed[0] = {5: 50.0, 11: 100.0}.get(step, elapsed[0] + 1.0)
            optimiser.step()
            scheduler.step()  # the rate of step + 1, computed at this elapsed time
            rates[step + 1] = optimiser.param_groups[0]["lr"]
        assert rates[1] == pytest.approx(1e-3)  # end of the 2-step warm-up
        assert rates[6] == pytest.approx(0.5e-3)  # half the time budget: half the rate
        assert rates[12] == pytest.approx(0.0, abs=1e-12)  # the budget spent: 0, whatever the step count
        module.on_fit_start()
        line = next(x for x in capsys.readouterr().out.splitlines() if "lr_schedule cosine" in x)
        assert "sized to --trainer.max_time (100 s)" in line and ("max_steps 1000" in line) == (max_steps > 0)
    # With both limits, whichever is further on drives the decay: here the steps.
    module.trainer = L.Trainer(max_time={"seconds": 10**6}, max_steps=12, logger=False, enable_checkpointing=False)
    config = module.configure_optimizers()
    optimiser, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    for _ in range(12):
        optimiser.step()
        scheduler.step()
    assert optimiser.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
