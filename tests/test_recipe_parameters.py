"""Every recipe and preset builds, with the parameter count it had when this test was written.

A change that moves code must not change these numbers; a change that alters a model on purpose updates the number
here in the same commit, so the change is visible in review.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gridtnp.models import build_model, count_parameters, create_model

ROOT = Path(__file__).resolve().parents[1]
TRAINING_KEYS = ("lr", "weight_decay", "warmup_steps", "lr_schedule", "cos_latitude_weighting", "latitude_dim")

RECIPE_PARAMETERS = {
    "era5_cnp.yaml": 50690,
    "era5_gka.yaml": 5,
    "era5_hypermixer.yaml": 624834,
    "era5_interp.yaml": 5,
    "era5_convcnp.yaml": 2107142,
    "era5_multisource_swin.yaml": 545602,
    "era5_pt_tnp.yaml": 639298,
    "era5_swin.yaml": 557506,
    "era5_swin_global.yaml": 2250498,
    "era5_vit.yaml": 340418,
    "era5_wind_swin.yaml": 2215684,
    "gp1d_cnp.yaml": 116226,
    "gp1d_convcnp.yaml": 135812,
    "gp1d_msa.yaml": 211522,
    "gp1d_pt_tnp_ist.yaml": 1558530,
    "gp1d_pt_tnp_perceiver.yaml": 1557250,
    "gp1d_rcnp.yaml": 29506,
    "gp1d_te_pt_tnp.yaml": 472787,
    "gp1d_te_tnp.yaml": 318130,
    "gp1d_tfs.yaml": 460226,
    "gp1d_tnp.yaml": 1043586,
    "gp2d_convcnp.yaml": 2107142,
    "gp2d_gka_knn.yaml": 5,
    "gp2d_hypermixer.yaml": 1276162,
    "gp2d_interp.yaml": 4,
    "gp2d_multimodal_swin.yaml": 1382914,
    "gp2d_pt_tnp.yaml": 1557378,
    "gp2d_swin_avg.yaml": 1043842,
    "gp2d_swin_ki.yaml": 1060356,
    "gp2d_swin_pt.yaml": 1274242,
    "gp2d_swin_pt_64.yaml": 1667458,
    "gp2d_swin_pt_full.yaml": 1274242,
    "gp2d_swin_te.yaml": 1277322,
    "gp2d_transformer_coarse.yaml": 695172,
    "gp2d_vit_ki.yaml": 1060356,
    "gp2d_vit_pt.yaml": 1175938,
    "gp2d_vit_pt_patch.yaml": 1339906,
    "sawtooth1d_tnp.yaml": 1043586,
    "sawtooth2d_te_tnp_rotation.yaml": 316600,
}

PRESET_PARAMETERS = {
    "cnp": 116226,
    "convcnp": 135812,
    "gka": 5,
    "gka_knn": 5,
    "interp": 4,
    "msa": 546306,
    "pt_tnp_ist": 1558530,
    "pt_tnp_perceiver": 1557250,
    "rcnp": 116354,
    "swin_tnp": 1274242,
    "te_pt_tnp": 1569978,
    "te_tnp": 1049298,
    "tfs": 943874,
    "tnp": 1043586,
    "vitnp": 1175938,
}


def test_every_recipe_is_listed():
    assert sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")) == sorted(RECIPE_PARAMETERS)


@pytest.mark.parametrize(("recipe", "expected"), sorted(RECIPE_PARAMETERS.items()))
def test_recipe_builds_with_its_parameter_count(recipe, expected):
    spec = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]["init_args"]
    spec = {k: v for k, v in spec.items() if k not in TRAINING_KEYS}
    assert count_parameters(build_model(spec)) == expected


@pytest.mark.parametrize(("preset", "expected"), sorted(PRESET_PARAMETERS.items()))
def test_preset_builds_with_its_parameter_count(preset, expected):
    assert count_parameters(create_model(preset)) == expected
