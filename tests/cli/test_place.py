"""``gridtnp place`` on a tiny 2-D GP checkpoint: the CSV of sites and the map, and a candidates file it cannot
read answered in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from gridtnp.cli import GridTNPCLI, main

#: A CNP of width 16 on 2-D GP tasks of 40 context and 40 target points: a checkpoint in a few seconds.
TINY = """
seed_everything: 0
model:
  class_path: gridtnp.NeuralProcessModule
  init_args:
    dim_x: 2
    dim_y: 1
    dim: 16
    encoder: {name: mlp}
    grid_encoder: {name: identity}
    processor: {name: mean}
    grid_decoder: {name: concat}
    likelihood: {name: gaussian}
data:
  class_path: gridtnp.data.SyntheticDataModule
  init_args:
    task: {name: gp2d, lengthscale: 0.5, num_context: 40, num_targets: 40, domain: [-2.0, 2.0]}
    loader: {batch_size: 4, train_batches: 2, val_batches: 1, test_batches: 2}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The recipe and a 1-step checkpoint of it."""
    root = tmp_path_factory.mktemp("place")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY)
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when given both args and command-line arguments
    GridTNPCLI(
        args=[
            "fit", "--config", str(recipe), "--trainer.max_steps", "1", "--trainer.logger", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0",
            "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(root),
            "--checkpoint.dirpath", str(root / "ckpt"), "--plots.every_n_validations", "0",
        ]
    )  # fmt: skip
    mp.undo()
    return recipe, root / "ckpt" / "last.ckpt"


def test_place_writes_the_sites_in_order_and_the_map(
    checkpoint: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, ckpt = checkpoint
    out = tmp_path / "placement"
    args = ["place", "--config", str(recipe), "--ckpt_path", str(ckpt), "--candidate_shape", "5", "--region_shape",
            "6", "--count", "3", "--hours", "3", "--max_tasks", "8", "--out", str(out)]  # fmt: skip
    main(args)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("gridtnp place: 3 sites of 25 candidates over 3 hours; gains ")
    table = pd.read_csv(out / "placement.csv")
    assert table.columns.tolist() == ["round", "name", "x0", "x1", "gain", "variance_before", "variance_after"]
    assert table["round"].tolist() == [1, 2, 3] and table["name"].is_unique
    assert ((table["x0"].abs() <= 2.0) & (table["x1"].abs() <= 2.0)).all()  # the box of the tasks' targets
    pd.testing.assert_series_equal(
        table["variance_before"] - table["variance_after"], table["gain"], check_names=False, rtol=1e-4
    )
    assert (out / "placement.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):  # an existing placement is not replaced without --overwrite
        main(args)
    assert "already exists; pass --overwrite" in capsys.readouterr().err


def test_a_candidates_file_without_the_input_columns_is_one_line(
    checkpoint: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, ckpt = checkpoint
    sites = tmp_path / "sites.csv"
    sites.write_text("name,lat,lon\nA,0.5,0.5\n")
    with pytest.raises(SystemExit) as exit_:
        main(["place", "--config", str(recipe), "--ckpt_path", str(ckpt), "--candidates", str(sites), "--out",
              str(tmp_path / "out")])  # fmt: skip
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gridtnp: error: --candidates {sites}: no column x0, x1; a candidates file needs one column per model input "
        "(x0, x1) and may have a name column; it has name, lat, lon."
    )
    assert not (tmp_path / "out").exists()
