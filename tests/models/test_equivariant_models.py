"""Whole models: TE-TNP, TE-PT-TNP and RCNP are translation equivariant, their rotation variants rotation invariant,
MSA / TFS permutation equivariant over targets; the shifted / bimodal / rotated tasks draw what they claim."""

from __future__ import annotations

import math

import pytest
import torch

from gridtnp.batch import Observations
from gridtnp.data import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.models import create_model
from gridtnp.registry import ConfigError, build_from_spec
from tests.conftest import random_context

#: Predictions of a TE model under a shift of all inputs agree to this tolerance (float32 rounding of x + shift).
TOL = {"atol": 1e-4, "rtol": 1e-4}

TE_MODELS = {
    "te_tnp post": ("te_tnp", {}),
    "te_tnp pre + location updates": ("te_tnp", {"variant": "pre", "update_locations": True}),
    "te_pt_tnp + location updates": ("te_pt_tnp", {"num_tokens": 8, "update_locations": True}),
    "rcnp": ("rcnp", {}),
}
ROTATION_MODELS = {
    "te_tnp": ("te_tnp", {"rotation": True, "update_locations": True}),
    "te_pt_tnp": ("te_pt_tnp", {"num_tokens": 8, "rotation": True, "update_locations": True}),
    "rcnp": ("rcnp", {"rotation": True}),
}


def small(name: str, **kwargs) -> torch.nn.Module:
    extra = {"layers": 2} if name != "rcnp" else {}
    return create_model(name, dim=32, dim_x=2, **extra, **kwargs).eval()


def predict(model, ctx: Observations, xt: torch.Tensor, transform) -> tuple[torch.Tensor, torch.Tensor]:
    moved = Observations(transform(ctx.x), ctx.y, ctx.mask)
    dist = model({"points": moved}, transform(xt))
    return dist.mean, dist.stddev


@pytest.mark.parametrize("key", list(TE_MODELS))
def test_translation_equivariance(key):
    name, kwargs = TE_MODELS[key]
    model = small(name, **kwargs)
    ctx, xt = random_context(dim_x=2), torch.randn(3, 7, 2)
    shift = torch.tensor([4.25, -2.5])
    mean, std = predict(model, ctx, xt, lambda x: x)
    mean_s, std_s = predict(model, ctx, xt, lambda x: x + shift)
    torch.testing.assert_close(mean_s, mean, **TOL)
    torch.testing.assert_close(std_s, std, **TOL)


def test_translation_equivariance_holds_with_chunking():
    """A memory bound of 5 (batch, query, key) triples: one query row per chunk, same predictions."""
    model = create_model(
        "te_tnp", dim=32, dim_x=2, layers=2, processor={"max_pairs": 5}, grid_decoder={"max_pairs": 5}
    ).eval()
    reference = create_model("te_tnp", dim=32, dim_x=2, layers=2, processor={"max_pairs": None})
    reference.load_state_dict(model.state_dict())
    ctx, xt = random_context(dim_x=2), torch.randn(3, 7, 2)
    mean, _ = predict(model, ctx, xt, lambda x: x + 10.0)
    torch.testing.assert_close(mean, predict(reference.eval(), ctx, xt, lambda x: x)[0], **TOL)


def test_ordinary_tnp_is_not_translation_equivariant():
    """The check above is meaningful: a TNP, which embeds x itself, changes its predictions under the same shift."""
    model = create_model("tnp", dim=32, dim_x=2, layers=2).eval()
    ctx, xt = random_context(dim_x=2), torch.randn(3, 7, 2)
    mean, _ = predict(model, ctx, xt, lambda x: x)
    mean_s, _ = predict(model, ctx, xt, lambda x: x + torch.tensor([4.25, -2.5]))
    assert not torch.allclose(mean, mean_s, atol=1e-3)


@pytest.mark.parametrize("key", list(ROTATION_MODELS))
def test_rotation_variant_is_invariant_to_rotating_and_moving_all_inputs(key):
    name, kwargs = ROTATION_MODELS[key]
    model = small(name, **kwargs)
    ctx, xt = random_context(dim_x=2), torch.randn(3, 7, 2)
    angle = 2.1
    r = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    mean, std = predict(model, ctx, xt, lambda x: x)
    mean_r, std_r = predict(model, ctx, xt, lambda x: x @ r.T + torch.tensor([1.5, -0.5]))
    torch.testing.assert_close(mean_r, mean, **TOL)
    torch.testing.assert_close(std_r, std, **TOL)
    # Without rotation=True the same model class does see rotations.
    plain = small(name, **{k: v for k, v in kwargs.items() if k != "rotation"})
    assert not torch.allclose(predict(plain, ctx, xt, lambda x: x @ r.T)[0], predict(plain, ctx, xt, lambda x: x)[0])


@pytest.mark.parametrize("name", ["msa", "tfs"])
def test_targets_attend_to_each_other_permutation_equivariantly(name):
    model = create_model(name, dim=32, layers=2).eval()
    ctx, xt = random_context(), torch.randn(3, 9, 1)
    out = model({"points": ctx}, xt).mean
    perm = torch.randperm(9)
    torch.testing.assert_close(model({"points": ctx}, xt[:, perm]).mean, out[:, perm], atol=1e-5, rtol=1e-5)
    # Targets interact: dropping some targets changes the others' predictions.
    assert not torch.allclose(model({"points": ctx}, xt[:, :4]).mean, out[:, :4], atol=1e-5)
    assert model.grid_decoder.targets_interact


def test_random_target_initialisation_is_random():
    model = create_model("te_tnp", dim=32, layers=1, encoder={"target_init": "random"}).eval()
    ctx, xt = random_context(), torch.randn(3, 5, 1)
    assert not torch.allclose(model({"points": ctx}, xt).mean, model({"points": ctx}, xt).mean)
    with pytest.raises(ValueError, match="target_init must be one of"):
        create_model("te_tnp", encoder={"target_init": "zeros"})


def test_te_processor_needs_locations():
    from gridtnp.nn.processors import TETransformerProcessor
    from gridtnp.nn.tokens import Latent

    with pytest.raises(ValueError, match="needs the tokens' locations"):
        TETransformerProcessor(dim=8, layers=1, heads=2, head_dim=4)(Latent(torch.randn(1, 3, 8)))


# --- tasks -------------------------------------------------------------------------------------------------------


def test_shifted_gp1d_is_the_same_tasks_moved_by_delta():
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    base = build_from_spec("task", {"name": "gp1d", "oracle": False}).sample(4, g())
    moved = build_from_spec("task", {"name": "gp1d", "shift": 1.0, "oracle": False}).sample(4, g())
    mask = base.context["points"].mask
    torch.testing.assert_close(moved.context["points"].x[mask], base.context["points"].x[mask] + 1.0)
    torch.testing.assert_close(moved.target.x, base.target.x + 1.0)
    torch.testing.assert_close(moved.target.y, base.target.y, atol=1e-4, rtol=1e-4)  # stationary kernels
    assert moved.target.x.min() >= -2.0 and moved.target.x.max() <= 4.0


def test_bimodal_inputs_avoid_the_gap():
    spec = {"name": "gp1d", "context_range": [[-4, -1], [1, 4]], "target_range": [[1, 4], [-4, -1]]}
    batch = build_from_spec("task", spec).sample(8, torch.Generator().manual_seed(0))
    x = torch.cat([batch.context["points"].x[batch.context["points"].mask], batch.target.x.flatten()[:, None]])
    assert (x.abs() >= 1).all() and (x.abs() <= 4).all()
    assert 0.3 < (x < 0).float().mean() < 0.7  # both modes, in proportion to their lengths
    with pytest.raises(ConfigError, match="must not overlap"):
        build_from_spec("task", {"name": "gp1d", "context_range": [[-4, 0], [-1, 4]]})


def test_rotated_sawtooth_directions():
    """Restricted training tasks vary along the diagonals; rotation moves every direction by a fixed angle."""
    g = torch.Generator().manual_seed(0)
    task = build_from_spec("task", {"name": "sawtooth2d_restricted", "rotation": 22.5})
    angles = torch.atan2(*task.directions(64, g).flip(-1).unbind(-1))
    offsets = torch.remainder(angles - math.radians(45 + 22.5), math.pi / 2)
    assert torch.allclose(torch.minimum(offsets, math.pi / 2 - offsets), torch.zeros(64), atol=1e-5)
    with pytest.raises(ConfigError, match="rotation must be an angle in degrees"):
        build_from_spec("task", {"name": "sawtooth2d", "rotation": "a lot"})


def test_test_task_serves_only_the_test_split():
    data = from_flat_arguments(
        SyntheticDataModule,
        task={"name": "gp1d"},
        test_task={"name": "gp1d", "shift": 1.0},
        batch_size=2,
        val_batches=1,
        test_batches=1,
    )
    assert data.split_task("train") is data.task and data.split_task("val") is data.task
    assert data.split_task("test").context_range == ((-1.0, 3.0),)
    with pytest.raises(ConfigError, match="test_task has dim_x=2"):
        from_flat_arguments(SyntheticDataModule, task={"name": "gp1d"}, test_task={"name": "sawtooth2d"})
