"""Contracts that every registered stage component keeps, checked over the registry rather than per component.

Every name that ``available(kind)`` lists for a stage kind is parametrised here by itself: each needs an entry in
``CASES`` (a small model it works in, with compatible neighbours), and a registered name without one fails with the
line to add. What is checked, per kind:

* encoder: context and target tokens ``[B, N, out_dim]``, finite; a point's token depends on that point only.
* grid_encoder: the layout it promises: grid tokens ``[B, M1..Md, dim]`` on its ``grid``, or the set itself with its
  mask, locations and source ids; padded points (NaN, masked out) change nothing; reordering the context changes
  nothing (grids) or reorders the set alike; on a grid with a rolled (periodic) dimension, moving the context by a
  whole period along it changes nothing.
* processor: ``num_states`` states of the input's layout (grid or set) and width; padded set tokens change no state.
* grid_decoder: ``[B, Nt, dim]``, finite; padded tokens of set states change nothing; reordering the targets
  reorders the outputs alike; a target's output does not depend on the other targets, padded ones included (unless
  the decoder says its targets interact: ``targets_interact``); on grid states with a rolled dimension, moving the
  targets by a whole period along it changes nothing.
* likelihood: a ``Distribution`` with mean and stddev ``[B, Nt, Dy]``, stddev > 0, finite log-densities; point-wise.
* embedding: ``[B, N, out_dim]``, finite; point-wise.
* every stage: a gradient reaches every parameter.
* whole models (every case, and a model with each ``residual`` and ``kriging``): a finite predictive with stddev > 0;
  padded context points (NaN, masked out) and the order of the context change no prediction; the tasks of a batch do
  not interact, and a task without any context point gets a finite prediction and finite gradients; a target's
  prediction does not depend on the other targets, padded ones included (unless the decoder's targets interact); a
  gradient reaches every parameter.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.distributions import Distribution

from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.models.neural_process import NeuralProcess
from gridtnp.nn.tokens import Latent, Tokens
from gridtnp.registry import KINDS, available

B, N, NT, PAD = 2, 10, 6, 3  # tasks, context points per source, targets, padded points
# Everything runs in float32, the precision the models compute in (the model casts float64 inputs to it, and several
# components keep sums, coordinates and log-densities in float32 whatever their parameters' dtype). Only rounding may
# differ between two runs compared here; a leak of padding or of another point is far larger.
DTYPE = torch.float32
TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread for these tiny tensors: more only add synchronisation, which costs most on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: Contract violations that are bugs of the component, ``{(test, case id): what is wrong}``: those tests are expected to
#: fail, strictly (once the bug is fixed the test passes, which fails until its entry here is removed).
KNOWN_BUGS: dict[tuple[str, str], str] = {}


@pytest.fixture(autouse=True)
def _known_bugs(request: pytest.FixtureRequest) -> None:
    """Mark the tests of ``KNOWN_BUGS`` as strictly expected to fail."""
    callspec = getattr(request.node, "callspec", None)
    reason = KNOWN_BUGS.get((request.node.originalname, callspec.id if callspec else None))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


# --- the cases: a small model around every registered component -------------------------------------------------

ATTN = {"heads": 2, "head_dim": 4, "mlp_dim": 16}
TE_ATTN = {**ATTN, "rho_hidden": 8}
GRID_1D = {"lower": [-2.0], "upper": [2.0], "shape": [16]}
GRID_2D = {"lower": [-2.0, -2.0], "upper": [2.0, 2.0], "shape": [8, 8]}
GLOBE = {"lower": [-60.0, 0.0], "upper": [60.0, 360.0], "shape": [4, 8]}  # latitude, longitude in degrees


def model(base: dict[str, Any], **keys: Any) -> dict[str, Any]:
    """``base`` with some slots or top-level keys replaced."""
    return {**copy.deepcopy(base), **copy.deepcopy(keys)}


# TNP in 1-D: the context as a masked set, MHSA, MHCA from the targets.
SET = {
    "dim_x": 1,
    "dim_y": 1,
    "dim": 16,
    "encoder": {"name": "mlp", "layers": 2},
    "grid_encoder": {"name": "identity"},
    "processor": {"name": "transformer", "layers": 2, **ATTN},
    "grid_decoder": {"name": "cross_attention", **ATTN},
    "likelihood": {"name": "gaussian", "layers": 2},
}
# TE-TNP: value-only tokens, the context set with its locations, TE attention.
TE = model(
    SET,
    encoder={"name": "value", "layers": 2},
    processor={"name": "te_transformer", "layers": 2, **TE_ATTN},
    grid_decoder={"name": "te_cross_attention", **TE_ATTN},
)
# Swin-TNP in 2-D on an 8 x 8 grid.
GRIDDED = {
    "dim_x": 2,
    "dim_y": 1,
    "dim": 16,
    "grid": GRID_2D,
    "encoder": {"name": "mlp", "layers": 2},
    "grid_encoder": {"name": "pseudo_token", **ATTN},
    "processor": {"name": "swin", "layers": 2, "window": 4, **ATTN},
    "grid_decoder": {"name": "knn", "k": 4, **ATTN},
    "likelihood": {"name": "gaussian", "layers": 2},
}
# ConvCNP in 1-D: the values as tokens, SetConv onto the grid, CNN, SetConv back.
CONV = {
    "dim_x": 1,
    "dim_y": 1,
    "dim": 8,
    "grid": GRID_1D,
    "encoder": {"name": "identity"},
    "grid_encoder": {"name": "kernel_interpolation"},
    "processor": {"name": "cnn", "channels": 8, "layers": 2},
    "grid_decoder": {"name": "kernel_interpolation"},
    "likelihood": {"name": "gaussian", "layers": 2},
}
# Interpolation baselines in 2-D: the context values kept as a set, read by an interpolating decoder.
BASELINE = {
    "dim_x": 2,
    "dim_y": 1,
    "dim": 1,
    "encoder": {"name": "identity"},
    "grid_encoder": {"name": "identity"},
    "processor": {"name": "identity"},
    "grid_decoder": {"name": "interpolation", "k": 3},
    "likelihood": {"name": "homoscedastic", "layers": 1},
}
CNP = model(SET, processor={"name": "mean"}, grid_decoder={"name": "concat", "layers": 2})
SOURCES = {"dim_y": {"a": 1, "b": 2}, "target_source": "a"}  # two context sources of different widths
TWINS = {"dim_y": {"a": 1, "b": 1}, "target_source": "a"}  # two context sources of one width
# Classical baselines: MOS on source a (the grid), kriging of its residuals at source b (the stations).
MOS = model(
    BASELINE,
    **TWINS,
    dim=2,
    grid_decoder={"name": "mos", "places": GRID_2D, "grid_source": "a", "spacing": 0.5},
    likelihood={"name": "direct"},
)
MOS_KRIGING = model(
    MOS,
    grid_decoder={"name": "mos_kriging", "places": GRID_2D, "grid_source": "a", "station_source": "b", "spacing": 0.5},
)

#: ``{kind: {name: [model specification, ...]}}``: the models each registered component is checked in (the first
#: at its defaults where it can be, the others with the options that add parameters or change its path).
CASES: dict[str, dict[str, list[dict[str, Any]]]] = {
    "encoder": {
        "mlp": [SET],
        "additive": [model(SET, encoder={"name": "additive", "layers": 2})],
        "value": [TE],
        "identity": [CONV],
    },
    "embedding": {
        "identity": [SET],
        "fourier": [
            model(SET, encoder={"name": "mlp", "layers": 2, "embed": {"name": "fourier", "num_wavelengths": 3}})
        ],
        "spherical_harmonics": [
            model(GRIDDED, encoder={"name": "mlp", "embed": {"name": "spherical_harmonics", "legendre_polynomials": 3}})
        ],
        "temporal": [model(GRIDDED, encoder={"name": "mlp", "embed": {"name": "temporal", "num_wavelengths": 3}})],
        "learned_grid": [
            model(GRIDDED, encoder={"name": "mlp", "embed": {"name": "learned_grid", "grid": GRID_2D, "channels": 4}})
        ],
        "composite": [
            model(
                GRIDDED,
                encoder={
                    "name": "additive",
                    "embed": {
                        "name": "composite",
                        "parts": [
                            {"name": "temporal", "dims": [0], "num_wavelengths": 2},
                            {"name": "learned_grid", "dims": [0, 1], "grid": GRID_2D, "channels": 2},
                        ],
                    },
                },
            )
        ],
    },
    "grid_encoder": {
        "patch": [model(GRIDDED, grid_encoder={"name": "patch"})],  # 8 x 8 averaged, 2 x 2 patches -> 4 x 4
        "identity": [SET, model(SET, **SOURCES, encoder={"name": "mlp", "layers": 2})],
        "pseudo_token": [
            GRIDDED,
            model(
                GRIDDED,
                grid_encoder={
                    "name": "pseudo_token",
                    "k": 4,
                    "max_tokens_per_cell": 2,
                    "self_key": False,
                    "relative_position": True,
                    **ATTN,
                },
            ),
        ],
        "average": [model(GRIDDED, grid_encoder={"name": "average"})],
        "kernel_interpolation": [
            model(GRIDDED, grid_encoder={"name": "kernel_interpolation"}),
            model(
                GRIDDED,
                grid_encoder={"name": "kernel_interpolation", "nearest_only": True, "k": 4, "coarsen": 2},
            ),
            model(GRIDDED, grid=GLOBE, grid_encoder={"name": "kernel_interpolation", "distance": "haversine"}),
            model(
                GRIDDED,
                grid_encoder={
                    "name": "kernel_interpolation",
                    "chunk_size": 4,
                    "density": False,
                    "learn_lengthscale": False,
                },
            ),
        ],
        "multi": [
            model(
                GRIDDED,
                **SOURCES,
                grid_encoder={
                    "name": "multi",
                    "encoder": {"a": {"name": "average"}, "b": {"name": "kernel_interpolation"}},
                },
            ),
            model(
                GRIDDED,
                **SOURCES,
                grid_encoder={
                    "name": "multi",
                    "merge": "sum",
                    "encoder": {"name": "pseudo_token", "coarsen": 2, **ATTN},
                },
            ),
        ],
    },
    "processor": {
        "transformer": [SET],
        "mean": [CNP],
        "identity": [model(TE, processor={"name": "identity"}, grid_decoder={"name": "relational", "hidden": 16})],
        "ist": [model(SET, processor={"name": "ist", "num_tokens": 4, "layers": 2, **ATTN})],
        "perceiver": [model(SET, processor={"name": "perceiver", "num_tokens": 4, "layers": 2, **ATTN})],
        "te_transformer": [
            TE,
            model(
                TE,
                processor={
                    "name": "te_transformer",
                    "layers": 2,
                    "update_locations": True,
                    "variant": "pre",
                    **TE_ATTN,
                },
            ),
            model(  # attention evaluated a few (batch, query, key) triples at a time
                TE,
                processor={"name": "te_transformer", "layers": 2, "max_pairs": 16, **TE_ATTN},
                grid_decoder={"name": "te_cross_attention", "max_pairs": 16, **TE_ATTN},
            ),
        ],
        "te_perceiver": [model(TE, processor={"name": "te_perceiver", "num_tokens": 4, "layers": 2, **TE_ATTN})],
        "hypermixer": [
            model(
                SET, processor={"name": "hypermixer", "layers": 2, "mixing_dim": 8, "hyper_hidden": 8, "mlp_dim": 16}
            ),
            model(GRIDDED, processor={"name": "hypermixer", "layers": 2, "mixing_dim": 8, "hyper_hidden": 8}),
        ],
        "cnn": [CONV, model(CONV, processor={"name": "cnn", "channels": 8, "layers": 2, "separable": False})],
        "unet": [model(CONV, dim_x=2, grid=GRID_2D, processor={"name": "unet", "channels": [8, 8, 8]})],
        "swin": [
            GRIDDED,
            model(
                GRIDDED,
                processor={"name": "swin", "layers": 2, "window": 4, "shift": 1, "share_weights": False, **ATTN},
            ),
        ],
        "vit": [
            model(GRIDDED, processor={"name": "vit", "layers": 2, "patch": 2, **ATTN}),
            model(GRIDDED, processor={"name": "vit", "layers": 2, **ATTN}),
        ],
    },
    "grid_decoder": {
        "cross_attention": [SET],
        "concat": [CNP],
        "te_cross_attention": [
            TE,
            model(
                TE,
                dim_x=2,
                processor={"name": "te_perceiver", "num_tokens": 4, "layers": 2, "update_locations": True, **TE_ATTN},
                grid_decoder={"name": "te_cross_attention", "update_locations": True, "rotation": True, **TE_ATTN},
            ),
        ],
        "relational": [
            model(TE, processor={"name": "identity"}, grid_decoder={"name": "relational", "hidden": 16}),
            model(
                TE,
                dim_x=2,
                processor={"name": "identity"},
                grid_decoder={"name": "relational", "hidden": 16, "rotation": True, "max_pairs": 8},
            ),
        ],
        "joint_self_attention": [
            model(
                SET,
                encoder={"name": "additive"},
                processor={"name": "identity"},
                grid_decoder={"name": "joint_self_attention", "blocks": 2, **ATTN},
            )
        ],
        "transformer_decoder": [
            model(SET, encoder={"name": "additive"}, grid_decoder={"name": "transformer_decoder", **ATTN})
        ],
        "knn": [
            GRIDDED,
            model(
                GRIDDED,
                **SOURCES,
                grid_decoder={
                    "name": "knn",
                    "k": 4,
                    "relative_position": "keys_values",
                    "distance_bias": True,
                    "context_k": 2,
                    **ATTN,
                },
            ),
            model(
                GRIDDED,
                **SOURCES,
                grid_decoder={
                    "name": "knn",
                    "k": 4,
                    "relative_position": True,
                    "context_k": 3,
                    "context_sources": ["b"],
                },
            ),
        ],
        "te_knn": [model(GRIDDED, grid_decoder={"name": "te_knn", "k": 4, **TE_ATTN})],
        "kernel_interpolation": [
            CONV,
            model(CONV, grid_decoder={"name": "kernel_interpolation", "nearest": 3, "chunk_size": 4}),
        ],
        "gka": [
            model(BASELINE, grid_decoder={"name": "gka", "modulate": True, "hidden": 8}),
            model(BASELINE, grid_decoder={"name": "gka", "k": 3}),
            model(GRIDDED, grid_decoder={"name": "gka", "in_dim": 16, "k": 4, "layers": 1}),
        ],
        # Two sources: with one, the learned weights over the sources would be a softmax over one (no gradient).
        "interpolation": [
            model(BASELINE, **TWINS),
            model(BASELINE, **TWINS, grid_decoder={"name": "interpolation", "k": 1, "power": 1.0}),
            model(  # source b multilinearly interpolated on its grid
                BASELINE,
                **TWINS,
                grid_decoder={
                    "name": "interpolation",
                    "gridded": {"b": {"lower": [-2, -2], "upper": [2, 2], "shape": [5, 5]}},
                },
            ),
        ],
        "mos": [MOS, model(MOS, grid_decoder={"name": "mos", "places": GRID_2D, "grid_source": "b", "radius": 0})],
        "mos_kriging": [
            MOS_KRIGING,
            model(
                MOS,
                grid_decoder={
                    "name": "mos_kriging",
                    "places": GRID_2D,
                    "grid_source": "a",
                    "station_source": "b",
                    "kernel": "rbf",
                },
            ),
        ],
        "persistence": [
            model(MOS, grid_decoder={"name": "persistence", "station_source": "b", "grid_source": "a"}),
            model(MOS, grid_decoder={"name": "persistence", "station_source": "a", "grid_source": "b", "tolerance": 0}),
        ],
    },
    "likelihood": {
        "direct": [MOS],
        "gaussian": [SET],
        "homoscedastic": [model(SET, likelihood={"name": "homoscedastic", "layers": 2})],
        "lowrank_gaussian": [model(SET, likelihood={"name": "lowrank_gaussian", "rank": 3})],
    },
    "residual": {
        "interpolation": [
            model(
                SET,
                dim_x=2,
                dim_y={"a": 1, "b": 1, "c": 1},
                target_source="a",
                residual={
                    "name": "interpolation",
                    "sources": ["a", "b"],
                    "k": 3,
                    "adaptive": True,
                    "spread": "b",
                    "spread_power": 0.5,
                    "departures": {"source": "c", "k": 2},
                    "regression": {"sources": ["a"], "grid": GRID_2D, "lengthscale": 0.75},
                },
            )
        ],
    },
    "kriging": {
        "gp": [model(SET, dim_x=2, **TWINS, kriging={"name": "gp", "source": "b", "grid": GRID_2D, "rank": 4})],
    },
}

STAGES = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood")
EXTRA_KINDS = ("embedding", "residual", "kriging")  # checked where the registry has them
EXAMPLES = {  # what a case of each kind looks like, for the message that asks for one
    "embedding": 'model(SET, encoder={"name": "mlp", "embed": {"name": NAME, ...}})',
    "residual": 'model(SET, dim_x=2, **TWINS, residual={"name": NAME, "sources": ["a", "b"], ...})',
    "kriging": 'model(SET, dim_x=2, **TWINS, kriging={"name": NAME, "source": "b", ...})',
}


def registered(kind: str) -> list[str]:
    """The registered names of ``kind`` (none for a kind the registry does not have); test doubles left out."""
    if kind not in KINDS:
        return []
    return [name for name in available(kind) if not name.startswith("_test")]


def missing_case(kind: str, name: str) -> str:
    """What to add when ``kind`` ``name`` is registered but has no case."""
    example = EXAMPLES.get(kind, f'model(SET, {kind}={{"name": NAME, ...}})').replace("NAME", f'"{name}"')
    return (
        f"{kind} {name!r} is registered but has no contract case: add to CASES[{kind!r}] in tests/nn/test_contracts.py "
        f'a line such as\n    "{name}": [{example}],\nwith neighbours it works with (bases: SET, TE, GRIDDED, CONV, '
        f"BASELINE, CNP; `gridtnp list {kind} {name}` shows its arguments)."
    )


def params(*kinds: str) -> list[Any]:
    """``(kind, name, spec)`` for every registered name of ``kinds`` and each of its cases (spec None: no case)."""
    out = []
    for kind in kinds:
        for name in registered(kind):
            for i, spec in enumerate(CASES.get(kind, {}).get(name) or [None]):
                out.append(pytest.param(kind, name, spec, id=f"{kind}-{name}" + (f"-{i}" if i else "")))
    return out


def model_params() -> list[Any]:
    """``params`` of every kind with each distinct model once (many components share their first case's model)."""
    seen, out = set(), []
    for param in params(*STAGES, *EXTRA_KINDS):
        key = json.dumps(param.values[2], sort_keys=True)
        if param.values[2] is None or key not in seen:
            seen.add(key)
            out.append(param)
    return out


def stage(np_model: NeuralProcess, kind: str) -> nn.Module | None:
    """The component of ``kind`` in ``np_model`` (an embedding: the target source's encoder's)."""
    encoder = np_model.encoders[np_model.target_source]
    if kind == "encoder":
        return encoder
    if kind == "embedding":
        return getattr(encoder, "embed", None)
    return getattr(np_model, kind, None)


def build(kind: str, name: str, spec: dict[str, Any] | None) -> NeuralProcess:
    """The case's model, checked to hold ``kind`` ``name``; fails with what to add when the name has no case."""
    if spec is None:
        pytest.fail(missing_case(kind, name), pytrace=False)
    torch.manual_seed(0)
    np_model = build_model(spec)
    built = getattr(stage(np_model, kind), "registry_name", None)
    assert built == name, f"the case listed under {kind} {name!r} builds {kind} {built!r}"
    return np_model


def test_every_registered_component_has_a_case():
    missing = [
        missing_case(kind, name)
        for kind in STAGES + EXTRA_KINDS
        for name in registered(kind)
        if not CASES.get(kind, {}).get(name)
    ]
    if missing:
        pytest.fail("\n\n".join(missing), pytrace=False)


def test_every_case_names_a_registered_component():
    stale = [
        f"CASES[{kind!r}][{name!r}]"
        for kind, names in CASES.items()
        for name in names
        if kind in KINDS and name not in registered(kind)
    ]
    assert not stale, f"cases for components the registry does not have (renamed or removed?): {', '.join(stale)}"


def test_every_known_bug_names_a_test_and_a_case():
    ids = {param.id for param in params(*STAGES, *EXTRA_KINDS)}
    stale = [
        key
        for key in KNOWN_BUGS
        if not key[0].startswith("test_")
        or key[0] not in globals()
        or (key[1].split("-")[0] in KINDS and key[1] not in ids)
    ]
    assert not stale, f"KNOWN_BUGS entries that match no test and case: {stale}"


# --- inputs and checks ------------------------------------------------------------------------------------------


def points(np_model: NeuralProcess, n: int, b: int = B) -> Tensor:
    """``[b, n, Dx]`` locations inside the cases' grids."""
    return (2 * torch.rand(b, n, np_model.dim_x, dtype=DTYPE) - 1) * 1.8


def context(np_model: NeuralProcess, b: int = B) -> dict[str, tuple[Tensor, Tensor]]:
    """``{source: (x [b, N, Dx], y [b, N, Dy])}`` for every source of the model."""
    return {s: (points(np_model, N, b), torch.randn(b, N, e.dim_y, dtype=DTYPE)) for s, e in np_model.encoders.items()}


def tokens(np_model: NeuralProcess, ctx: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Tokens]:
    """The encoders' tokens of ``ctx`` (every point real), as the model hands them to its grid encoder."""
    with torch.no_grad():
        return {
            s: Tokens(x, np_model.encoders[s](x, y), torch.ones(x.shape[:2], dtype=torch.bool))
            for s, (x, y) in ctx.items()
        }


def garbage(*shape: int, nan: bool = False) -> Tensor:
    """Values for padded slots: NaN, or large finite noise."""
    return torch.full(shape, float("nan"), dtype=DTYPE) if nan else 100 * torch.randn(*shape, dtype=DTYPE)


def pad_tokens(t: Tokens) -> Tokens:
    """``t`` with ``PAD`` masked-out points of NaN appended (padded values may be NaN: see ``zero_padding``)."""
    b, _, d = t.z.shape
    return Tokens(
        torch.cat([t.x, garbage(b, PAD, t.x.shape[-1], nan=True)], 1),
        torch.cat([t.z, garbage(b, PAD, d, nan=True)], 1),
        torch.cat([t.mask, torch.zeros(b, PAD, dtype=torch.bool)], 1),
    )


def pad_set(latent: Latent) -> Latent:
    """A set latent with ``PAD`` masked-out tokens of finite garbage appended (locations too)."""
    b, _, d = latent.tokens.shape
    z = torch.cat([latent.tokens, garbage(b, PAD, d)], 1)
    mask = torch.cat([latent.mask, torch.zeros(b, PAD, dtype=torch.bool)], 1)
    x = None if latent.x is None else torch.cat([latent.x, garbage(b, PAD, latent.x.shape[-1])], 1)
    source = None if latent.source is None else torch.cat([latent.source, latent.source[:, :PAD]], 1)
    return Latent(z, mask=mask, x=x, grid=latent.grid, source=source)


def gather(t: Tensor, order: Tensor) -> Tensor:
    """Rows of ``t [B, N, ...]`` in ``order [B, N]``."""
    index = order.view(*order.shape, *([1] * (t.dim() - 2))).expand(*order.shape, *t.shape[2:])
    return torch.gather(t, 1, index)


def shuffle(n: int, b: int = B) -> Tensor:
    """A random order ``[b, n]`` of ``n`` points per task."""
    return torch.stack([torch.randperm(n) for _ in range(b)])


def rolled(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the last dimension of its grid rolled (periodic, as longitude is)."""
    grid = dict(spec["grid"], roll=[False] * (len(spec["grid"]["shape"]) - 1) + [True])
    return model(spec, grid=grid)


def shifted(x: Tensor, spec: dict[str, Any], periods: int) -> Tensor:
    """``x [..., Dx]`` moved by whole ``periods`` of the grid along its last (rolled) dimension."""
    period = spec["grid"]["upper"][-1] - spec["grid"]["lower"][-1]
    return torch.cat([x[..., :-1], x[..., -1:] + periods * period], -1)


def perturb(module: nn.Module) -> None:
    """Move every parameter off its initial value, so that layers initialised to zero (a residual branch that starts
    switched off) do not hide the parameters behind them from the gradient check."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))


def assert_gradient_reaches_every_parameter(module: nn.Module, outputs: list[Tensor]) -> None:
    """A random projection of ``outputs`` back-propagates a finite, non-zero gradient into every parameter.

    The projection is random because a plain sum can cancel exactly (the outputs of a LayerNorm sum to its bias).
    """
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        return
    loss = sum((o.float() * torch.randn(o.shape)).sum() for o in outputs)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    dead = [n for (n, _), g in zip(named, grads, strict=True) if g is None or not bool(g.abs().sum() > 0)]
    bad = [n for (n, _), g in zip(named, grads, strict=True) if g is not None and not bool(torch.isfinite(g).all())]
    assert not dead, f"no gradient reaches parameter(s) {dead}"
    assert not bad, f"non-finite gradient in parameter(s) {bad}"


def assert_pointwise(fn: Callable[..., Any], inputs: list[Tensor], outputs: Callable[[Any], list[Tensor]]) -> None:
    """Changing point 1 of ``inputs`` (each ``[B, N, ...]``) changes no other point's ``outputs`` ``[B, N, ...]``."""
    before = outputs(fn(*inputs))
    changed = [t.clone() for t in inputs]
    for t in changed:
        t[:, 1] = torch.randn_like(t[:, 1])
    after = outputs(fn(*changed))
    others = [i for i in range(inputs[0].shape[1]) if i != 1]
    for old, new in zip(before, after, strict=True):
        torch.testing.assert_close(new[:, others], old[:, others], **TOL)


# --- encoders and embeddings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "name", "spec"), params("encoder"))
def test_encoder_tokens_are_pointwise(kind, name, spec):
    np_model = build(kind, name, spec)
    for (x, y), enc in zip(context(np_model).values(), np_model.encoders.values(), strict=True):
        assert isinstance(enc.dim_y, int) and isinstance(enc.out_dim, int), "encoders have dim_y and out_dim"
        for inputs in ([x, y], [x]):  # context (x, y), targets (x, None)
            z = enc(*inputs)
            assert z.shape == (B, N, enc.out_dim) and torch.isfinite(z).all()
            assert_pointwise(enc, inputs, lambda z: [z])


@pytest.mark.parametrize(("kind", "name", "spec"), params("embedding"))
def test_embedding_features_are_pointwise(kind, name, spec):
    np_model = build(kind, name, spec)
    embedding, x = stage(np_model, kind), points(np_model, N)
    out = embedding(x)
    assert out.shape == (B, N, embedding.out_dim) and torch.isfinite(out).all()
    assert_pointwise(embedding, [x], lambda f: [f])


@pytest.mark.parametrize(("kind", "name", "spec"), params("encoder", "embedding"))
def test_encoder_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    module = stage(np_model, kind)
    perturb(module)
    x, y = next(iter(context(np_model).values()))
    outputs = [module(x)] if kind == "embedding" else [module(x, y), module(x, None)]
    assert_gradient_reaches_every_parameter(module, outputs)


# --- grid encoders ----------------------------------------------------------------------------------------------


def real_rows(latent: Latent) -> Tensor:
    """A latent's content without its padding: grid tokens, or a set's real rows with their locations and sources."""
    if latent.mask is None:
        return latent.tokens
    parts = [latent.tokens, latent.x, None if latent.source is None else latent.source.unsqueeze(-1)]
    rows = torch.cat([p.to(latent.tokens.dtype) for p in parts if p is not None], -1)
    return rows[latent.mask].view(B, -1, rows.shape[-1])


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_encoder"))
def test_grid_encoder_writes_the_layout_it_promises(kind, name, spec):
    np_model = build(kind, name, spec)
    encoder, inputs = np_model.grid_encoder, tokens(np_model, context(np_model))
    latent = encoder(inputs)
    assert isinstance(latent, Latent) and torch.isfinite(latent.tokens).all()
    grid = getattr(encoder, "grid", None)  # the model builds the processor and decoder for this grid
    if grid is not None:
        assert latent.grid == grid, "a grid encoder with a grid writes its tokens on it"
        assert latent.tokens.shape == (B, *grid.shape, spec["dim"]) and latent.mask is None and latent.x is None
    else:  # the union of the sources' sets, with its mask, locations and each token's source
        n, width, dim_x = len(inputs) * N, next(iter(inputs.values())).z.shape[-1], np_model.dim_x
        assert latent.grid is None and latent.tokens.shape == (B, n, width)
        assert latent.mask is not None and latent.mask.shape == (B, n) and latent.mask.dtype == torch.bool
        assert latent.x is not None and latent.x.shape == (B, n, dim_x)
        if latent.source is not None:
            assert latent.source.shape == (B, n) and set(latent.source.unique().tolist()) <= set(range(len(inputs)))


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_encoder"))
def test_grid_encoder_ignores_padded_points(kind, name, spec):
    np_model = build(kind, name, spec)
    inputs = tokens(np_model, context(np_model))
    latent = np_model.grid_encoder(inputs)
    padded = np_model.grid_encoder({s: pad_tokens(t) for s, t in inputs.items()})
    torch.testing.assert_close(real_rows(padded), real_rows(latent), **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_encoder"))
def test_grid_encoder_ignores_the_order_of_the_context(kind, name, spec):
    np_model = build(kind, name, spec)
    inputs = tokens(np_model, context(np_model))
    orders = {s: shuffle(N) for s in inputs}
    shuffled = {s: Tokens(*(gather(v, orders[s]) for v in (t.x, t.z, t.mask))) for s, t in inputs.items()}
    latent, reordered = np_model.grid_encoder(inputs), np_model.grid_encoder(shuffled)
    if latent.mask is None:
        torch.testing.assert_close(reordered.tokens, latent.tokens, **TOL)
    else:  # a set: the same rows in the new order, each source's block in its place
        order = torch.cat([orders[s] + i * N for i, s in enumerate(inputs)], 1)
        torch.testing.assert_close(real_rows(reordered), gather(real_rows(latent), order), **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_encoder"))
def test_grid_encoder_wraps_rolled_dimensions(kind, name, spec):
    if spec is not None and "grid" not in spec:
        pytest.skip("a model without a grid")
    np_model = build(kind, name, spec and rolled(spec))
    if getattr(np_model.grid_encoder, "grid", None) is None:
        pytest.skip("a grid encoder without a grid")
    inputs = tokens(np_model, context(np_model))
    latent = np_model.grid_encoder(inputs)
    for periods in (-1, 1):
        moved = {s: Tokens(shifted(t.x, spec, periods), t.z, t.mask) for s, t in inputs.items()}
        torch.testing.assert_close(np_model.grid_encoder(moved).tokens, latent.tokens, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_encoder"))
def test_grid_encoder_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    perturb(np_model.grid_encoder)
    latent = np_model.grid_encoder(tokens(np_model, context(np_model)))
    assert_gradient_reaches_every_parameter(np_model.grid_encoder, [latent.tokens])


# --- processors -------------------------------------------------------------------------------------------------


def encoded(np_model: NeuralProcess) -> Latent:
    """The grid encoder's latent of a random context, without gradients."""
    with torch.no_grad():
        return np_model.grid_encoder(tokens(np_model, context(np_model)))


@pytest.mark.parametrize(("kind", "name", "spec"), params("processor"))
def test_processor_states_keep_the_layout(kind, name, spec):
    np_model = build(kind, name, spec)
    latent = encoded(np_model)
    states = np_model.processor(latent)
    assert isinstance(states, list) and len(states) == getattr(np_model.processor, "num_states", 1)
    width = latent.tokens.shape[-1]
    for state in states:
        assert isinstance(state, Latent) and torch.isfinite(state.tokens).all()
        assert state.tokens.shape == states[-1].tokens.shape, "every state has one layout"
        assert state.tokens.shape[0] == B and state.tokens.shape[-1] == width
        if latent.mask is None:  # grid in, grid out, on the state's own grid where it carries one (a coarser one)
            grid = state.grid or latent.grid
            assert state.mask is None and grid is not None and state.tokens.shape == (B, *grid.shape, width)
        else:  # set in, set out
            assert state.grid is None and state.tokens.dim() == 3
            if state.mask is not None:
                assert state.mask.shape == state.tokens.shape[:2] and state.mask.dtype == torch.bool
            if state.x is not None:
                assert state.x.shape == (*state.tokens.shape[:2], np_model.dim_x)


@pytest.mark.parametrize(("kind", "name", "spec"), params("processor"))
def test_processor_ignores_padded_set_tokens(kind, name, spec):
    np_model = build(kind, name, spec)
    latent = encoded(np_model)
    if latent.mask is None:
        pytest.skip("grid tokens have no padding")
    with torch.no_grad():
        states, padded = np_model.processor(latent), np_model.processor(pad_set(latent))
    for state, other in zip(states, padded, strict=True):
        n = state.tokens.shape[1]  # a state per input token (padding after the first n) or per pseudo-token
        torch.testing.assert_close(other.tokens[:, :n], state.tokens, **TOL)
        if state.x is not None:
            torch.testing.assert_close(other.x[:, :n], state.x, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("processor"))
def test_processor_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    perturb(np_model.processor)
    states = np_model.processor(encoded(np_model))
    outputs = [s.tokens for s in states] + [s.x for s in states if s.x is not None and s.x.requires_grad]
    assert_gradient_reaches_every_parameter(np_model.processor, outputs)


# --- grid decoders ----------------------------------------------------------------------------------------------


def upstream(np_model: NeuralProcess) -> tuple[dict[str, Tokens], list[Latent], Tensor, Tensor]:
    """Context tokens, processor states, target tokens ``[B, NT, D]`` and target locations, without gradients."""
    ctx = tokens(np_model, context(np_model))
    xt = points(np_model, NT)
    with torch.no_grad():
        states = np_model.processor(np_model.grid_encoder(ctx))
        zt = np_model.encoders[np_model.target_source](xt, None)
    return ctx, states, zt, xt


def decode(np_model: NeuralProcess, states: list[Latent], zt: Tensor, xt: Tensor, ctx: dict[str, Tokens]) -> Tensor:
    """The grid decoder's output, with the context tokens for a decoder that reads them (as the model calls it)."""
    if getattr(np_model.grid_decoder, "takes_context", False):
        return np_model.grid_decoder(states, zt, xt, context=ctx)
    return np_model.grid_decoder(states, zt, xt)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_decoder"))
def test_grid_decoder_decodes_each_target_on_its_own(kind, name, spec):
    np_model = build(kind, name, spec)
    ctx, states, zt, xt = upstream(np_model)
    with torch.no_grad():
        out = decode(np_model, states, zt, xt, ctx)
        assert out.shape == (B, NT, spec["dim"]) and torch.isfinite(out).all()
        order = shuffle(NT)
        torch.testing.assert_close(
            decode(np_model, states, gather(zt, order), gather(xt, order), ctx), gather(out, order), **TOL
        )
        if getattr(np_model.grid_decoder, "targets_interact", False):
            return  # documented: a target's output depends on the other targets (reordering them still holds)
        torch.testing.assert_close(decode(np_model, states, zt[:, :2], xt[:, :2], ctx), out[:, :2], **TOL)
        # Padded targets hold anything (locations far off the grid, say): the real targets do not see them.
        zt_pad, xt_pad = (
            torch.cat([zt, garbage(B, PAD, zt.shape[-1])], 1),
            torch.cat([xt, garbage(B, PAD, xt.shape[-1])], 1),
        )
        torch.testing.assert_close(decode(np_model, states, zt_pad, xt_pad, ctx)[:, :NT], out, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_decoder"))
def test_grid_decoder_ignores_padded_set_tokens(kind, name, spec):
    np_model = build(kind, name, spec)
    ctx, states, zt, xt = upstream(np_model)
    if all(state.mask is None for state in states):
        pytest.skip("states without a mask have no padding")
    padded = [state if state.mask is None else pad_set(state) for state in states]
    with torch.no_grad():
        torch.testing.assert_close(decode(np_model, padded, zt, xt, ctx), decode(np_model, states, zt, xt, ctx), **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_decoder"))
def test_grid_decoder_wraps_rolled_dimensions(kind, name, spec):
    if spec is not None and "grid" not in spec:
        pytest.skip("a model without a grid")
    np_model = build(kind, name, spec and rolled(spec))
    ctx, states, zt, xt = upstream(np_model)
    if states[-1].mask is not None or states[-1].x is not None:
        pytest.skip("set states: no grid to wrap around")
    if getattr(np_model.grid_decoder, "takes_context", False):
        pytest.skip("documented: the context neighbours of a decoder's skip connection are found without wrapping")
    with torch.no_grad():
        out = decode(np_model, states, zt, xt, ctx)
        for periods in (-1, 1):
            torch.testing.assert_close(decode(np_model, states, zt, shifted(xt, spec, periods), ctx), out, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), params("grid_decoder"))
def test_grid_decoder_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    perturb(np_model.grid_decoder)
    ctx, states, zt, xt = upstream(np_model)
    assert_gradient_reaches_every_parameter(np_model.grid_decoder, [decode(np_model, states, zt, xt, ctx)])


# --- likelihoods ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "name", "spec"), params("likelihood"))
def test_likelihood_is_a_pointwise_distribution(kind, name, spec):
    np_model = build(kind, name, spec)
    likelihood, dim_y = np_model.likelihood, np_model.encoders[np_model.target_source].dim_y
    zt = torch.randn(B, NT, spec["dim"], dtype=DTYPE)
    dist = likelihood(zt)
    assert isinstance(dist, Distribution)
    assert dist.mean.shape == dist.stddev.shape == (B, NT, dim_y)
    assert torch.isfinite(dist.mean).all() and torch.isfinite(dist.stddev).all() and (dist.stddev > 0).all()
    logp = dist.log_prob(torch.randn(B, NT, dim_y))
    assert logp.shape == (B, NT, dim_y) and torch.isfinite(logp).all()
    assert_pointwise(likelihood, [zt], lambda d: [d.mean, d.stddev])


@pytest.mark.parametrize(("kind", "name", "spec"), params("likelihood"))
def test_likelihood_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    perturb(np_model.likelihood)
    dist = np_model.likelihood(torch.randn(B, NT, spec["dim"], dtype=DTYPE))
    assert_gradient_reaches_every_parameter(np_model.likelihood, [dist.mean, dist.stddev])


# --- whole models -----------------------------------------------------------------------------------------------


def observations(np_model: NeuralProcess, pad: int = 0) -> dict[str, Observations]:
    """A context of ``N`` points per source and task, then ``pad`` masked-out points of NaN."""
    out = {}
    for s, (x, y) in context(np_model).items():
        mask = torch.arange(N + pad).expand(B, -1) < N
        x, y = (torch.cat([v, garbage(B, pad, v.shape[-1], nan=True)], 1) for v in (x, y))
        out[s] = Observations(x, y, mask)
    return out


def select(
    ctx: dict[str, Observations], tasks: slice = slice(None), order: dict[str, Tensor] | None = None
) -> dict[str, Observations]:
    """Some tasks of ``ctx``, with each source's points in the order ``order[source] [B, N]`` if given."""
    out = {}
    for s, o in ctx.items():
        x, y, mask = (v if order is None else gather(v, order[s]) for v in (o.x, o.y, o.mask))
        out[s] = Observations(x[tasks], y[tasks], mask[tasks])
    return out


def predict(np_model: NeuralProcess, ctx: dict[str, Observations], xt: Tensor) -> Tensor:
    """Mean and stddev ``[b, Nt, 2 Dy]``, without gradients."""
    with torch.no_grad():
        dist = np_model(ctx, xt)
    return torch.cat([dist.mean, dist.stddev], -1)


MODEL_PARAMS = model_params()


@pytest.mark.parametrize(("kind", "name", "spec"), MODEL_PARAMS)
def test_model_predicts_a_distribution_from_the_real_context_only(kind, name, spec):
    np_model = build(kind, name, spec)
    padded, xt = observations(np_model, pad=PAD), points(np_model, NT)
    out = predict(np_model, padded, xt)
    dim_y = np_model.encoders[np_model.target_source].dim_y
    assert out.shape == (B, NT, 2 * dim_y) and torch.isfinite(out).all() and (out[..., dim_y:] > 0).all()
    real = {s: Observations(o.x[:, :N], o.y[:, :N], o.mask[:, :N]) for s, o in padded.items()}
    torch.testing.assert_close(predict(np_model, real, xt), out, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), MODEL_PARAMS)
def test_model_ignores_the_order_of_the_context(kind, name, spec):
    np_model = build(kind, name, spec)
    ctx, xt = observations(np_model), points(np_model, NT)
    order = {s: shuffle(N) for s in ctx}
    torch.testing.assert_close(predict(np_model, select(ctx, order=order), xt), predict(np_model, ctx, xt), **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), MODEL_PARAMS)
def test_model_tasks_and_targets_do_not_interact(kind, name, spec):
    np_model = build(kind, name, spec)
    ctx, xt = observations(np_model), points(np_model, NT)
    out = predict(np_model, ctx, xt)
    torch.testing.assert_close(predict(np_model, select(ctx, slice(0, 1)), xt[:1]), out[:1], **TOL)
    if getattr(np_model.grid_decoder, "targets_interact", False):
        return  # documented: a target's prediction depends on the other targets
    torch.testing.assert_close(predict(np_model, ctx, xt[:, :2]), out[:, :2], **TOL)
    padded = torch.cat([xt, garbage(B, PAD, xt.shape[-1], nan=True)], 1)  # padded target slots may hold anything
    torch.testing.assert_close(predict(np_model, ctx, padded)[:, :NT], out, **TOL)


@pytest.mark.parametrize(("kind", "name", "spec"), MODEL_PARAMS)
def test_model_predicts_for_a_task_without_context(kind, name, spec):
    np_model = build(kind, name, spec)
    sources = list(np_model.encoders)
    for empty in [sources] + ([[s] for s in sources] if len(sources) > 1 else []):
        ctx, xt = observations(np_model), points(np_model, NT)
        for s in empty:
            ctx[s].mask[0] = False  # task 0 has no point of these sources
        out = predict(np_model, ctx, xt)
        assert torch.isfinite(out).all() and (out[..., out.shape[-1] // 2 :] > 0).all(), f"without {empty}"
        torch.testing.assert_close(predict(np_model, select(ctx, slice(1, 2)), xt[1:]), out[1:], **TOL)
        np_model.zero_grad()
        dist = np_model(ctx, xt)
        dist.log_prob(torch.randn(dist.mean.shape)).sum().backward()
        bad = [n for n, p in np_model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"without {empty}: non-finite gradient in parameter(s) {bad}"


@pytest.mark.parametrize(("kind", "name", "spec"), MODEL_PARAMS)
def test_model_gradient_reaches_every_parameter(kind, name, spec):
    np_model = build(kind, name, spec)
    perturb(np_model)
    dist = np_model(observations(np_model, pad=PAD), points(np_model, NT))
    assert_gradient_reaches_every_parameter(np_model, [dist.mean, dist.stddev])
