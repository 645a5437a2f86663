"""Every recipe and preset builds, with the parameter count it had when this test was written.

A change that moves code must not change these numbers; a change that alters a model on purpose updates the number
here in the same commit, so the change is visible in review.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gridtnp.models import build_model, count_parameters, create_model

ROOT = Path(__file__).resolve().parents[2]
TRAINING_KEYS = (
    "lr",
    "weight_decay",
    "warmup_steps",
    "lr_schedule",
    "cos_latitude_weighting",
    "latitude_dim",
    "variance_calibration",  # a buffer, not a parameter
)

RECIPE_PARAMETERS = {
    "era5_cnp.yaml": 54850,
    "era5_convcnp.yaml": 2123654,
    "era5_gka.yaml": 5,
    "era5_hypermixer.yaml": 628994,  # 624,834 + the deeper Gaussian head
    "era5_interp.yaml": 5,
    "era5_mos.yaml": 17787,  # 33 x 49 places x (1 + 9 coefficients + 1 log variance)
    "era5_mos_kriging.yaml": 17790,  # + the GP's lengthscale, output scale and noise
    "era5_mos_leads.yaml": 17787,  # era5_mos.yaml's decoder on forecast tasks
    "era5_multisource_swin.yaml": 549762,
    "era5_observations_swin.yaml": 738779,
    "era5_persistence_leads.yaml": 1,  # one log variance
    "era5_pt_tnp.yaml": 643458,
    "era5_swin.yaml": 482993,  # + learned_grid (33 x 49 x 16, 16 encoder inputs), residual (2 + 128 + 260 + 2 +
    # regression: 33 x 49 x 66 coefficients, (1 + gain + 9 shape terms up to cubic) x 6 position monomials, and 1
    # lengthscale),
    # kriging (33 x 49 x 16 place features and 4 scales)
    "era5_swin_leads.yaml": 713799,  # era5_observations_swin.yaml without kriging, + Fourier features of the hours
    "era5_swin_global.yaml": 2267010,
    "era5_swin_joint.yaml": 713943,  # era5_observations_swin.yaml - kriging (25,876) + the rank-16 head (64 x 16 + 16)
    "era5_vit.yaml": 344578,
    "era5_wind_swin.yaml": 2232196,
    "gp1d_cnp.yaml": 132738,
    "gp1d_convcnp.yaml": 152324,
    "gp1d_msa.yaml": 215682,
    "gp1d_pt_tnp_ist.yaml": 1475586,
    "gp1d_pt_tnp_perceiver.yaml": 1573762,
    "gp1d_rcnp.yaml": 33666,
    "gp1d_te_pt_tnp.yaml": 476658,  # the last decoder block moves no locations (no phi: they are never read)
    "gp1d_te_tnp.yaml": 322290,
    "gp1d_tfs.yaml": 464386,
    "gp1d_tnp.yaml": 1060098,
    "gp2d_convcnp.yaml": 2123654,
    "gp2d_gka_knn.yaml": 5,
    "gp2d_hypermixer.yaml": 1292674,  # 1,276,162 + the deeper Gaussian head
    "gp2d_interp.yaml": 4,
    "gp2d_multimodal_swin.yaml": 1399426,
    "gp2d_paper_cnp.yaml": 231682,
    "gp2d_paper_convcnp.yaml": 2123654,
    "gp2d_paper_pt_tnp_ist.yaml": 1524866,
    "gp2d_paper_swin_ki.yaml": 1109636,
    "gp2d_paper_swin_pt.yaml": 1323522,
    "gp2d_paper_vit.yaml": 1389186,
    "gp2d_pt_tnp.yaml": 1573890,
    "gp2d_swin_avg.yaml": 1060354,
    "gp2d_swin_ki.yaml": 1076868,
    "gp2d_swin_pt.yaml": 1290754,
    "gp2d_swin_pt_64.yaml": 1683970,
    "gp2d_swin_pt_full.yaml": 1290754,
    "gp2d_swin_te.yaml": 1293834,
    "gp2d_transformer_coarse.yaml": 711684,
    "gp2d_vit_ki.yaml": 1076868,
    "gp2d_vit_pt.yaml": 1192450,
    "gp2d_vit_pt_patch.yaml": 1356418,
    "sawtooth1d_tnp.yaml": 1060098,
    "sawtooth2d_te_tnp_rotation.yaml": 320439,  # as gp1d_te_pt_tnp: no phi in the last decoder block
}

PRESET_PARAMETERS = {
    "cnp": 132738,
    "convcnp": 152324,
    "gka": 5,
    "gka_knn": 5,
    "interp": 4,
    "msa": 562818,
    "pt_tnp_ist": 1475586,
    "pt_tnp_perceiver": 1573762,
    "rcnp": 132866,
    "swin_tnp": 1290754,
    "te_pt_tnp": 1586618,
    "te_tnp": 1065810,
    "tfs": 960386,
    "tnp": 1060098,
    "vitnp": 1192450,
}


def recipe_model_spec(recipe: str) -> dict:
    """The model specification of ``recipes/<recipe>`` without the training settings."""
    spec = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]["init_args"]
    return {k: v for k, v in spec.items() if k not in TRAINING_KEYS}


def table_line(recipe: str) -> str:
    """The ``RECIPE_PARAMETERS`` entry to paste for ``recipe``: its name and current parameter count."""
    try:
        count = count_parameters(build_model(recipe_model_spec(recipe)))
    except Exception as err:  # the message still names the recipe, and says why it has no count
        return f'    "{recipe}": ...,  # it does not build: {type(err).__name__}: {err}'
    return f'    "{recipe}": {count},'


def test_every_recipe_is_listed():
    recipes = {p.name for p in (ROOT / "recipes").glob("*.yaml")}
    new, gone = sorted(recipes - set(RECIPE_PARAMETERS)), sorted(set(RECIPE_PARAMETERS) - recipes)
    message = []
    if new:
        message += [
            "recipe(s) without a parameter count: add these lines to RECIPE_PARAMETERS in "
            "tests/models/test_recipe_parameters.py (the count is the recipe's model as it builds now):",
            *(table_line(r) for r in new),
        ]
    if gone:
        message += ["RECIPE_PARAMETERS lists recipe(s) that recipes/ no longer has: remove these lines:"]
        message += [f'    "{r}": {RECIPE_PARAMETERS[r]},' for r in gone]
    if message:
        pytest.fail("\n".join(message), pytrace=False)


@pytest.mark.parametrize(("recipe", "expected"), sorted(RECIPE_PARAMETERS.items()))
def test_recipe_builds_with_its_parameter_count(recipe, expected):
    count = count_parameters(build_model(recipe_model_spec(recipe)))
    assert count == expected, (
        f"recipes/{recipe} builds a model of {count} parameters, not {expected}. If the change is deliberate, set its "
        f'line in RECIPE_PARAMETERS to:\n    "{recipe}": {count},'
    )


@pytest.mark.parametrize(("preset", "expected"), sorted(PRESET_PARAMETERS.items()))
def test_preset_builds_with_its_parameter_count(preset, expected):
    assert count_parameters(create_model(preset)) == expected
