"""Every recipe under recipes/ (subfolders included) builds through the CLI: parsed by ``gridtnp fit``'s parser,
its model and DataModule instantiated (no store is opened, no step is taken), and an old flat data key fails with
one line naming its new section."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridtnp.cli.lightning import GridTNPCLI
from gridtnp.cli.main import main
from gridtnp.data.contract import GridDataModule
from gridtnp.module import NeuralProcessModule

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").rglob("*.yaml"))
# On a CPU-only machine: one CPU process, no logger; every other key as the recipe has it.
CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "1", "--trainer.strategy",
       "auto", "--trainer.precision", "32-true", "--trainer.logger", "false"]  # fmt: skip


def test_the_recipes_are_found() -> None:
    assert len(RECIPES) > 100 and any(r.startswith("recipes/paper/") for r in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_builds_through_the_cli(recipe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["gridtnp"])
    cli = GridTNPCLI(run=False, args=["--config", recipe, *CPU])
    assert isinstance(cli.model, NeuralProcessModule)
    assert isinstance(cli.datamodule, GridDataModule)
    assert cli.datamodule.batch_size >= 1


@pytest.mark.parametrize(
    ("recipe", "flat", "moved"),
    [
        ("recipes/era5_swin.yaml", "batch_size", "loader.batch_size"),
        ("recipes/era5_swin.yaml", "train_dates", "splits.train"),
        ("recipes/era5_swin.yaml", "climatology", "task.climatology"),
        ("recipes/era5_multisource_swin.yaml", "window", "task.window"),
        ("recipes/gp1d_tnp.yaml", "val_batches", "loader.val_batches"),
    ],
)
def test_an_old_flat_data_key_fails_with_one_line_naming_its_section(
    recipe: str, flat: str, moved: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.yaml"
    value = '["2019-03-01", "2019-03-02"]' if flat.endswith("_dates") else "2"
    old.write_text(f"data:\n  init_args:\n    {flat}: {value}\n")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / recipe), "--config", str(old), "--print_config"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == (
        f"gridtnp: error: data.init_args.{flat} moved to data.init_args.{moved} (a section of the recipe's data: keys)."
    )
    assert len([line for line in lines if line.startswith("gridtnp: error")]) == 1


def test_a_typo_inside_a_section_names_the_section_and_the_closest_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("data:\n  init_args:\n    store:\n      cache_chunk: 2\n")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "recipes/era5_swin.yaml"), "--config", str(typo), "--print_config"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        "gridtnp: error: data.init_args.store of StationReanalysisDataModule has no key 'cache_chunk' "
        "(did you mean 'cache_chunks'?); its keys: path, storage_options,"
    )
