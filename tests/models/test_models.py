"""Every model preset: shapes, padding and permutation invariance, empty context, bad input."""

import pytest
import torch

from gridtnp.batch import BatchError, Observations
from gridtnp.models import build_model, create_model
from gridtnp.registry import ConfigError, available
from tests.conftest import random_context

PRESETS = available("model")


def small(name: str):
    model = create_model(name, dim=32)
    return model.eval()


def targets(model, b=3, n=9):
    return torch.randn(b, n, model.dim_x)


@pytest.mark.parametrize("name", PRESETS)
def test_shapes_and_finite(name):
    model = small(name)
    ctx = random_context(dim_x=model.dim_x)
    dist = model({"points": ctx}, targets(model))
    assert dist.mean.shape == (3, 9, 1) and dist.stddev.shape == (3, 9, 1)
    assert torch.isfinite(dist.mean).all() and (dist.stddev > 0).all()


@pytest.mark.parametrize("name", PRESETS)
def test_padding_does_not_change_predictions(name):
    model = small(name)
    ctx = random_context(dim_x=model.dim_x)
    xt = targets(model)
    b, _, dx = ctx.x.shape
    padded = Observations(
        torch.cat([ctx.x, 50 * torch.randn(b, 5, dx)], 1),
        torch.cat([ctx.y, 50 * torch.randn(b, 5, 1)], 1),
        torch.cat([ctx.mask, torch.zeros(b, 5, dtype=torch.bool)], 1),
    )
    a, p = model({"points": ctx}, xt), model({"points": padded}, xt)
    torch.testing.assert_close(p.mean, a.mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p.stddev, a.stddev, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", PRESETS)
def test_context_permutation_invariance_and_target_independence(name):
    model = small(name)
    ctx = random_context(dim_x=model.dim_x)
    xt = targets(model)
    out = model({"points": ctx}, xt).mean
    perm = torch.randperm(ctx.num_points)
    shuffled = Observations(ctx.x[:, perm], ctx.y[:, perm], ctx.mask[:, perm])
    torch.testing.assert_close(model({"points": shuffled}, xt).mean, out, atol=1e-5, rtol=1e-5)
    # Each target's prediction depends on its own location only, not on the other targets; except in models whose
    # decoder lets targets attend to each other (MSA, TFS), which are permutation equivariant instead.
    if getattr(model.grid_decoder, "targets_interact", False):
        perm_t = torch.randperm(xt.shape[1])
        torch.testing.assert_close(model({"points": ctx}, xt[:, perm_t]).mean, out[:, perm_t], atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(model({"points": ctx}, xt[:, :4]).mean, out[:, :4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", PRESETS)
def test_empty_context_is_finite_and_trainable(name):
    model = create_model(name, dim=32)
    ctx = random_context(dim_x=model.dim_x)
    empty = Observations(ctx.x, ctx.y, torch.zeros_like(ctx.mask))
    dist = model({"points": empty}, targets(model))
    dist.log_prob(torch.zeros_like(dist.mean)).mean().backward()
    assert torch.isfinite(dist.mean).all() and torch.isfinite(dist.stddev).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", PRESETS)
def test_nan_values_are_missing_observations(name):
    model = small(name)
    ctx = random_context(dim_x=model.dim_x)
    xt = targets(model)
    y = ctx.y.clone()
    y[:, 1] = float("nan")
    with_nan = model({"points": Observations(ctx.x, y, ctx.mask)}, xt)
    mask = ctx.mask.clone()
    mask[:, 1] = False
    masked = model({"points": Observations(ctx.x, ctx.y, mask)}, xt)
    assert torch.isfinite(with_nan.mean).all()
    torch.testing.assert_close(with_nan.mean, masked.mean, atol=1e-5, rtol=1e-5)


def test_mismatched_shapes_name_the_tensor():
    with pytest.raises(BatchError, match=r"context\['points'\].*x is \(2, 5, 1\), y is \(2, 6, 1\)"):
        Observations(torch.zeros(2, 5, 1), torch.zeros(2, 6, 1), name="context['points']")
    with pytest.raises(BatchError, match=r"mask must be a bool tensor \[B, N\]"):
        Observations(torch.zeros(2, 5, 1), torch.zeros(2, 5, 1), torch.ones(2, 5))
    with pytest.raises(BatchError, match=r"x must be a tensor \[B, N, Dx\]"):
        Observations(torch.zeros(2, 5), torch.zeros(2, 5, 1))


def test_model_rejects_wrong_dimensions_and_sources():
    model = small("tnp")
    ctx = random_context()
    with pytest.raises(ValueError, match=r"target x must be \[B, Nt, Dx\] with Dx = dim_x = 1"):
        model({"points": ctx}, torch.zeros(3, 4, 2))
    with pytest.raises(ValueError, match=r"context\['points'\].y must be \[B, N, 1\]"):
        model({"points": Observations(ctx.x, torch.zeros(3, 12, 2), ctx.mask)}, torch.zeros(3, 4, 1))
    with pytest.raises(ValueError, match=r"source\(s\) \['stations'\]"):
        model({"stations": ctx}, torch.zeros(3, 4, 1))


def test_build_errors_are_actionable():
    spec = {
        "encoder": {"name": "mlp"},
        "grid_encoder": {"name": "identity"},
        "processor": {"name": "transfomer"},
        "grid_decoder": {"name": "cross_attention"},
        "likelihood": {"name": "gaussian"},
    }
    with pytest.raises(ConfigError, match="Did you mean 'transformer'"):
        build_model(spec)
    with pytest.raises(ConfigError, match=r"missing slot\(s\) \['likelihood'\]"):
        build_model({k: v for k, v in spec.items() if k != "likelihood"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['procesor'\]"):
        build_model({**spec, "procesor": {"name": "transformer"}})
    with pytest.raises(ConfigError, match="target_source must name one of the context sources"):
        build_model({"preset": "tnp", "dim_y": {"grid": 1, "points": 1}})


def test_multi_source_context():
    model = create_model("tnp", dim=32, dim_y={"grid": 2, "points": 1}, target_source="points").eval()
    grid, points = random_context(dim_y=2), random_context()
    xt = torch.randn(3, 5, 1)
    both = model({"grid": grid, "points": points}, xt).mean
    only_points = model({"points": points}, xt).mean
    assert both.shape == (3, 5, 1)
    assert not torch.allclose(both, only_points)  # the second source is used


def test_preset_overrides_merge_into_slots():
    model = create_model("tnp", dim=32, layers=2, likelihood={"name": "homoscedastic"})
    assert model.processor.num_states == 2 and len(model.grid_decoder.blocks) == 2
    assert type(model.likelihood).__name__ == "HomoscedasticLikelihood"


def test_gaussian_head_has_two_hidden_layers_as_the_te_tnp_paper():
    """The default head is Linear-GELU-Linear-GELU-Linear (two hidden layers); checked against the layers by hand."""
    from torch.nn import functional as F

    from gridtnp.nn.likelihoods import GaussianLikelihood

    torch.manual_seed(0)
    head = GaussianLikelihood(dim=8, dim_y=2, min_noise=1e-3)
    linears = [m for m in head.head if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(8, 8), (8, 8), (8, 4)]
    z = torch.randn(3, 5, 8)
    h = F.gelu(linears[1](F.gelu(linears[0](z))))
    mean, raw = linears[2](h).chunk(2, -1)
    dist = head(z)
    torch.testing.assert_close(dist.mean, mean)
    torch.testing.assert_close(dist.stddev, (F.softplus(raw) + 1e-3).sqrt())


def test_gaussian_min_std_adds_sigma_min_to_the_standard_deviation():
    """min_std: std = sqrt(softplus(raw)) + sigma_min (the gridded TNP paper's eq. 14), not a variance floor."""
    from torch.nn import functional as F

    from gridtnp.nn.likelihoods import GaussianLikelihood

    torch.manual_seed(0)
    head = GaussianLikelihood(dim=8, dim_y=1, min_noise=0.0, min_std=0.1)
    z = torch.randn(2, 6, 8)
    raw = head.head(z).chunk(2, -1)[1]
    torch.testing.assert_close(head(z).stddev, F.softplus(raw).sqrt() + 0.1)
    assert (head(z).stddev > 0.1).all()
    with pytest.raises(ValueError, match="min_std must be >= 0"):
        GaussianLikelihood(min_std=-0.1)


@pytest.mark.parametrize("name", PRESETS)
def test_every_parameter_gets_a_gradient(name):
    # A parameter outside the loss's graph is dead compute in the forward pass and makes DDP fail without
    # find_unused_parameters (e.g. a context update after the last pseudo-token layer that nothing reads).
    model = create_model(name, dim=32)
    ctx = random_context(dim_x=model.dim_x)
    dist = model({"points": ctx}, targets(model))
    dist.log_prob(torch.zeros_like(dist.mean)).mean().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"{name}: parameters with no gradient: {unused}"
