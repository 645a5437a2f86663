"""The gridded TNP paper's recipes (recipes/paper/): each builds, with a parameter count within 5 % of the paper's.

``PAPER_PARAMETERS`` is the Params column of the paper's Tables 1-4 (millions). Rows whose count gridtnp cannot
reach from the paper and the authors' code would be in ``OUTSIDE`` with the reason (none is); the test checks that
they really are outside, so a fix that brings one in must move it. ``python benchmarks/paper_parameters.py`` prints
both columns. Models are built on the meta device (no memory, no initialisation) where their constructors allow.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gridtnp.data.sections import from_flat_arguments
from gridtnp.models import build_model, count_parameters
from gridtnp.nn.grid_decoders.sets import JointSelfAttentionDecoder
from gridtnp.nn.grid_encoders import AverageGridEncoder, PseudoTokenGridEncoder
from gridtnp.nn.grids import Grid
from gridtnp.nn.tokens import Latent, Tokens

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "recipes" / "paper"
TRAINING_KEYS = ("lr", "weight_decay", "warmup_steps", "lr_schedule", "cos_latitude_weighting", "latitude_dim")
TOLERANCE = 0.05

PAPER_PARAMETERS = {
    # Table 1: t2m at stations from gridded skt
    "table1_cnp.yaml": 0.34,
    "table1_pt_tnp_m256.yaml": 1.57,
    "table1_convcnp_64x128_no_nnca.yaml": 9.36,
    "table1_vit_ki_48x96.yaml": 1.14,
    "table1_vit_pt_48x96.yaml": 1.83,
    "table1_vit_ki_144x288_to_48x96.yaml": 1.29,
    "table1_vit_pt_144x288_to_48x96.yaml": 6.69,
    "table1_swin_ki_64x128.yaml": 1.14,
    "table1_swin_pt_64x128.yaml": 2.29,
    "table1_swin_ki_64x128_no_nnca.yaml": 1.14,
    "table1_swin_pt_64x128_no_nnca.yaml": 2.29,
    "table1_swin_pt_64x128_skt_only.yaml": 2.29,
    "table1_swin_pt_64x128_t2m_only.yaml": 2.24,
    "table1_convcnp_192x384.yaml": 9.36,
    "table1_swin_pt_192x384.yaml": 10.67,
    # Table 2: multi-source wind
    "table2_cnp.yaml": 0.66,
    "table2_pt_tnp_m64.yaml": 1.79,
    "table2_convcnp_24x60.yaml": 14.41,
    "table2_vit_multi_ki_12x30.yaml": 1.49,
    "table2_vit_multi_pt_12x30.yaml": 2.36,
    "table2_vit_multi_ki_24x60_to_12x30.yaml": 1.55,
    "table2_vit_multi_pt_24x60_to_12x30.yaml": 3.25,
    "table2_swin_multi_ki_24x60.yaml": 1.49,
    "table2_swin_multi_pt_24x60.yaml": 3.19,
    "table2_swin_single_ki_24x60.yaml": 1.39,
    "table2_swin_single_pt_24x60.yaml": 1.67,
    "table2_convcnp_48x120.yaml": 14.41,
    "table2_swin_multi_pt_48x120.yaml": 6.51,
    # Table 3: 2-D GP
    "table3_cnp.yaml": 0.21,
    "table3_pt_tnp_m128.yaml": 1.50,
    "table3_pt_tnp_m256.yaml": 1.52,
    "table3_convcnp_32x32.yaml": 2.11,
    "table3_convcnp_64x64.yaml": 6.70,
    "table3_vit_ki_32x32_to_16x16.yaml": 1.16,
    "table3_vit_pt_32x32_to_16x16.yaml": 1.39,
    "table3_vit_ki_16x16.yaml": 1.09,
    "table3_vit_pt_16x16.yaml": 1.22,
    "table3_vit_ki_64x64_to_32x32.yaml": 1.16,
    "table3_vit_pt_64x64_to_32x32.yaml": 1.78,
    "table3_vit_ki_32x32.yaml": 1.09,
    "table3_vit_pt_32x32.yaml": 1.32,
    "table3_swin_ki_32x32.yaml": 1.09,
    "table3_swin_pt_32x32.yaml": 1.32,
    "table3_swin_avg_32x32.yaml": 1.22,
    "table3_swin_ki_64x64.yaml": 1.09,
    "table3_swin_pt_64x64.yaml": 1.72,
    "table3_swin_avg_64x64.yaml": 1.62,
    "table3_swin_ki_32x32_no_nnca.yaml": 1.09,
    "table3_swin_pt_32x32_no_nnca.yaml": 1.32,
    # Table 4: small 2-D GP
    "table4_tnp.yaml": 0.60,
    "table4_vit_pt_32x32_to_16x16.yaml": 1.39,
    "table4_swin_pt_32x32.yaml": 1.32,
}

# Row -> why gridtnp cannot build it within TOLERANCE of the paper's count. Empty: the authors' U-Net
# (processor unet, downsampling max_pool) and CNP depth bring the ConvCNP and CNP rows in.
OUTSIDE: dict[str, str] = {}


def recipe(name: str) -> dict:
    return yaml.safe_load((PAPER / name).read_text())


def model_spec(name: str) -> dict:
    spec = recipe(name)["model"]["init_args"]
    return {k: v for k, v in spec.items() if k not in TRAINING_KEYS}


def count_on_meta(spec: dict) -> int:
    """Parameters of the model ``spec`` builds, built on the meta device unless a constructor reads tensor values."""
    try:
        with torch.device("meta"):
            return count_parameters(build_model(spec))
    except NotImplementedError:  # e.g. an embedding that keeps its wavelengths as Python floats
        return count_parameters(build_model(spec))


def test_every_paper_recipe_is_listed():
    assert sorted(p.name for p in PAPER.glob("*.yaml")) == sorted(PAPER_PARAMETERS)
    assert set(OUTSIDE) <= set(PAPER_PARAMETERS)


@pytest.mark.parametrize(("name", "paper"), sorted(PAPER_PARAMETERS.items()))
def test_paper_recipe_parameter_count(name: str, paper: float):
    header = re.search(r"([0-9.]+) M parameters", (PAPER / name).read_text())
    assert header is not None and float(header.group(1)) == paper, "the header's Params must be the table's"
    n = count_on_meta(model_spec(name)) / 1e6
    within = abs(n - paper) <= TOLERANCE * paper
    assert within != (name in OUTSIDE), f"{name}: {n:.3f} M vs the paper's {paper} M ({OUTSIDE.get(name, '')})"


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_paper_recipe_trains_as_the_authors_code(name: str):
    """AdamW's default weight decay (0.01); eq. 14's sigma_min = 0.1 in Table 1; SKI on 100 points in Tables 3-4."""
    spec = recipe(name)
    assert spec["model"]["init_args"]["weight_decay"] == 0.01
    likelihood = spec["model"]["init_args"]["likelihood"]
    if name.startswith("table1"):
        assert (likelihood.get("min_std"), likelihood.get("min_noise")) == (0.1, 0.0)
    if name.startswith(("table3", "table4")):
        task = spec["data"]["init_args"]["task"]
        assert task["grid_size"] == 100
        embed = spec["model"]["init_args"]["encoder"].get("embed", {})
        if embed:  # the authors' 64 features per dimension, longest wavelength the input range
            low, high = task["domain"]
            assert (embed["num_wavelengths"], embed["max_wavelength"]) == (32, high - low)


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_paper_recipe_data_section_constructs(name: str):
    data = recipe(name)["data"]
    module, cls = data["class_path"].rsplit(".", 1)
    getattr(importlib.import_module(module), cls)(**data["init_args"])  # checks every option (no store is opened)


@pytest.mark.parametrize(
    ("name", "sources"),
    [("table1_swin_pt_64x128_t2m_only.yaml", ["stations"]), ("table1_swin_pt_64x128_skt_only.yaml", None)],
)
def test_station_ablations_run_on_the_embedded_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, sources: list[str] | None
):
    """t2m only: no "grid" source at all; skt only: no station in the context. Both feed the recipe's model."""
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path))
    from gridtnp.data import StationReanalysisDataModule

    init = recipe(name)["data"]["init_args"]["task"]
    keep = ("grid_variables", "context_fraction", "targets", "unique_grid_points", "coarsen", "coarsen_offset")
    # The embedded sample holds t2m only: the skt-only recipe reads t2m on the grid here.
    args = {k: init[k] for k in keep} | {"store": None, "batch_size": 2}
    if sources is None:
        args["grid_variables"] = ["t2m"]
    dm = from_flat_arguments(StationReanalysisDataModule, **args)
    dm.prepare_data()
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert sorted(batch.context) == sorted(sources or ["grid", "stations"]) == sorted(dm.dim_y)
    if sources is None:
        assert not batch.context["stations"].mask.any()  # skt only: every station is a target, none is context
    spec = model_spec(name)
    model = build_model(spec)
    with torch.no_grad():
        dist = model(batch.context, batch.target.x)
    assert dist.mean.shape == batch.target.y.shape and torch.isfinite(dist.mean).all()


def test_station_tasks_refuse_time_features_without_grid_variables():
    from gridtnp.data import StationReanalysisDataModule
    from gridtnp.registry import ConfigError

    with pytest.raises(ConfigError, match="time_features"):
        from_flat_arguments(StationReanalysisDataModule, grid_variables=[], time_features=True)


def test_context_keys_only_makes_each_target_independent_of_the_others():
    """The TNP's mask: a target decoded with others gives what it gives decoded alone (a loop over targets)."""
    torch.manual_seed(0)
    decoder = JointSelfAttentionDecoder(dim=16, blocks=2, heads=2, head_dim=8, mlp_dim=16, context_keys_only=True)
    zc, mask = torch.randn(2, 7, 16), torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    zt = torch.randn(2, 4, 16)
    states = [Latent(zc, mask=mask)]
    together = decoder(states, zt, torch.zeros(2, 4, 2))
    alone = torch.cat([decoder(states, zt[:, i : i + 1], torch.zeros(2, 1, 2)) for i in range(4)], dim=1)
    torch.testing.assert_close(together, alone)
    # Without the mask (MSA) targets see one another.
    decoder.context_keys_only = False
    assert not torch.allclose(decoder(states, zt, torch.zeros(2, 4, 2)), together)


def test_shared_pseudo_tokens_equal_the_same_tokens_repeated_per_grid_point():
    """shared_dims [0] on a time x lat x lon grid: the same as one token per point holding copies across time."""
    torch.manual_seed(0)
    grid = Grid([0.0, 0.0, 0.0], [3.0, 1.0, 2.0], [4, 3, 5])
    shared = PseudoTokenGridEncoder(grid, dim=16, heads=2, head_dim=8, mlp_dim=16, shared_dims=[0])
    full = PseudoTokenGridEncoder(grid, dim=16, heads=2, head_dim=8, mlp_dim=16)
    assert shared.pseudo_tokens.shape == (1, 3, 5, 16)
    state = shared.state_dict()
    state["pseudo_tokens"] = state["pseudo_tokens"].expand(4, 3, 5, 16).clone()
    full.load_state_dict(state)
    x = torch.rand(2, 30, 3) * torch.tensor([3.0, 1.0, 2.0])
    tokens = {"s": Tokens(x, torch.randn(2, 30, 16), torch.ones(2, 30, dtype=torch.bool))}
    torch.testing.assert_close(shared(tokens).tokens, full(tokens).tokens)
    with pytest.raises(ValueError, match="shared_dims"):
        PseudoTokenGridEncoder(grid, dim=16, shared_dims=[3])


def test_average_learned_tokens_add_one_token_per_grid_point():
    """learned_tokens: the plain averages (checked against a loop over cells) plus a per-location token."""
    torch.manual_seed(0)
    grid = Grid([0.0, 0.0], [1.0, 1.0], [3, 3])
    plain = AverageGridEncoder(grid, dim=4)
    learned = AverageGridEncoder(grid, dim=4, learned_tokens=True)
    learned.load_state_dict(plain.state_dict() | {"tokens": learned.tokens.detach()}, strict=True)
    x, z = torch.rand(1, 40, 2), torch.randn(1, 40, 4)
    tokens = {"s": Tokens(x, z, torch.ones(1, 40, dtype=torch.bool))}
    out_plain = plain(tokens).tokens
    cells = torch.round(x[0] * 2).long()  # nearest of the points 0, 0.5, 1 along each axis
    for i in range(3):  # loop over cells: the reference mean
        for j in range(3):
            inside = (cells[:, 0] == i) & (cells[:, 1] == j)
            want = z[0, inside].mean(0) if inside.any() else torch.zeros(4)
            torch.testing.assert_close(out_plain[0, i, j], want)
    torch.testing.assert_close(learned(tokens).tokens, out_plain + learned.tokens)


def test_plain_cnn_is_a_stack_of_convolutions_computed_with_numpy():
    """processor cnn, residual false: Linear, conv, ReLU, conv, Linear; zero padding, wrapped along a rolled dim."""
    from gridtnp.nn.processors.convolutional import CNNProcessor

    torch.manual_seed(0)
    grid = Grid([0.0, 0.0], [1.0, 1.0], [4, 5], roll=[False, True])
    cnn = CNNProcessor(grid, dim=3, channels=2, layers=2, kernel_size=3, separable=False, residual=False)
    tokens = torch.randn(1, 4, 5, 3)
    got = cnn(Latent(tokens, grid=grid))[0].tokens[0].detach().numpy()

    def linear(layer: torch.nn.Linear, h: np.ndarray) -> np.ndarray:
        return h @ layer.weight.detach().numpy().T + layer.bias.detach().numpy()

    def conv(layer: torch.nn.Module, h: np.ndarray) -> np.ndarray:  # h [4, 5, C]; a loop over cells and taps
        w, bias = layer.conv.weight.detach().numpy(), layer.conv.bias.detach().numpy()  # [out, in, 3, 3]
        out = np.zeros((4, 5, w.shape[0]))
        for i in range(4):
            for j in range(5):
                out[i, j] = bias
                for a in range(3):
                    for b in range(3):
                        ii, jj = i + a - 1, (j + b - 1) % 5
                        if 0 <= ii < 4:
                            out[i, j] += w[:, :, a, b] @ h[ii, jj]
        return out

    h = linear(cnn.inp, tokens[0].numpy())
    h = conv(cnn.spatial[1], np.maximum(conv(cnn.spatial[0], h), 0.0))
    np.testing.assert_allclose(got, linear(cnn.out, h), rtol=1e-5, atol=1e-5)
    assert len(cnn.pointwise) == 0
