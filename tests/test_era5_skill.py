"""benchmarks/era5_skill.py: layouts as given on the command line, and a baseline refitted on another layout."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("era5_skill", ROOT / "benchmarks" / "era5_skill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_layouts_keep_their_order_and_the_first_is_the_fitted_one() -> None:
    skill = load_script()
    layouts = skill.parse_layouts(["train=4:0,0", "shifted=4:1,0", "coarse3=3:0,2"])
    assert list(layouts) == ["train", "shifted", "coarse3"]
    assert layouts["coarse3"] == (3, (0, 2))
    assert skill.parse_layouts([]) == {"train": (4, (0, 0))}


def test_a_refitted_baseline_trains_validates_and_regresses_on_the_new_layout() -> None:
    skill = load_script()
    config = yaml.safe_load((ROOT / "recipes" / "era5_mos_kriging.yaml").read_text())
    again = skill.refitted(config, (3, (1, 0)), (4, (0, 0)))
    data = again["data"]["init_args"]["task"]
    assert (data["coarsen"], data["coarsen_offset"]) == (3, [1, 0])
    assert (data["eval_coarsen"], data["eval_offset"]) == (3, [1, 0])
    spacing = config["model"]["init_args"]["grid_decoder"]["spacing"]
    assert again["model"]["init_args"]["grid_decoder"]["spacing"] == spacing * 3 / 4  # the stencil follows the blocks
    assert config["data"]["init_args"]["task"]["coarsen_offset"] == [0, 0]  # the recipe itself is left as it was


def test_scores_split_held_out_and_context_stations() -> None:
    skill = load_script()
    y = np.zeros((2, 3))
    mean = np.array([[1.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    predictions = {
        "mean": mean,
        "std": np.ones((2, 3)),
        "y": y,
        "mask": np.array([[True, True, True], [True, True, False]]),
        "is_context": np.array([[False, True, False], [False, True, False]]),
        "coarse": np.ones((2, 3)),
    }
    scores = skill.scores(predictions)
    assert np.isclose(scores["rmse_heldout"], np.sqrt((1 + 4 + 1) / 3))  # the masked target is left out
    assert scores["rmse_context"] == 0.0 and scores["mean_z2_context"] == 0.0
    assert scores["targets"] == 5
