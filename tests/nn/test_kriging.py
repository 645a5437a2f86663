"""Kriging of the network's residuals: the layer against the GP posterior written out in numpy, padding, exactness
at the context points, chunked prediction, gradients and actionable errors."""

import numpy as np
import pytest
import torch
from torch.distributions import Normal

from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.nn.kriging import ResidualKriging
from gridtnp.registry import ConfigError

GRID = {"lower": [0.0, 0.0], "upper": [4.0, 4.0], "shape": [9, 9]}


def kriging(**kwargs) -> ResidualKriging:
    args = {"source": "stations", "dim_x": 2, "dim_y": 1, "source_dims": {"grid": 1, "stations": 1}, "grid": GRID}
    return ResidualKriging(**{**args, **kwargs}).double()


def numpy_posterior(layer, xc, rc, xt, mean_t, std_t):
    """The GP posterior of the standardised departures ``rc`` at ``xt`` for one task, from the kernel's formula."""
    table = layer.features.table.detach().numpy() * layer.features.lr_scale
    grid = layer.features.grid

    def features(x):  # bilinear on the 9 x 9 lattice over [0, 4]^2, spacing 0.5
        u = x / np.array(grid.spacing)
        i0 = np.clip(np.floor(u), 0, 7).astype(int)
        f = u - i0
        out = 0.0
        for a in (0, 1):
            for b in (0, 1):
                w = (f[:, 0] if a else 1 - f[:, 0]) * (f[:, 1] if b else 1 - f[:, 1])
                out = out + w[:, None] * table[(i0[:, 0] + a) * 9 + i0[:, 1] + b]
        return out

    taper, ell, a2, _ = np.exp(layer.scales().detach().numpy())
    nugget = float(layer.nugget.detach())
    rank = layer.rank

    def k(xa, xb):
        d2 = ((xa[:, None] - xb[None]) ** 2).sum(-1)
        fa, fb = features(xa), features(xb)
        return np.exp(-0.5 * d2 / taper**2) * (fa @ fb.T) / rank + a2 * np.exp(-0.5 * d2 / ell**2)

    def corr(xa, xb):
        return k(xa, xb) / np.sqrt(np.diag(k(xa, xa))[:, None] * np.diag(k(xb, xb))[None])

    a = corr(xc, xc) + nugget * np.eye(len(xc))
    cross = corr(xt, xc)
    mean = mean_t + std_t * (cross @ np.linalg.solve(a, rc))
    var = std_t**2 * (1 + nugget - np.einsum("tc,tc->t", cross, np.linalg.solve(a, cross.T).T))
    return mean, np.sqrt(var)


def test_posterior_matches_the_closed_form_and_ignores_padded_points():
    torch.manual_seed(0)
    layer = kriging(rank=4, nugget=0.05)
    xc = torch.rand(2, 6, 2, dtype=torch.float64) * 4
    yc = torch.randn(2, 6, 1, dtype=torch.float64)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    xc[1, 4:], yc[1, 4:] = 99.0, 1e3  # padding that must not count
    context = Normal(torch.randn(2, 6, 1, dtype=torch.float64), torch.rand(2, 6, 1, dtype=torch.float64) + 0.5)
    xt = torch.rand(2, 5, 2, dtype=torch.float64) * 4
    dist = Normal(torch.randn(2, 5, 1, dtype=torch.float64), torch.rand(2, 5, 1, dtype=torch.float64) + 0.5)
    got = layer(layer.condition(xc, yc, valid, context), xt, dist)
    for b, n in ((0, 6), (1, 4)):
        rc = ((yc[b, :n] - context.mean[b, :n]) / context.stddev[b, :n]).numpy()[:, 0]
        mean, std = numpy_posterior(
            layer, xc[b, :n].numpy(), rc, xt[b].numpy(), dist.mean[b, :, 0].numpy(), dist.stddev[b, :, 0].numpy()
        )
        np.testing.assert_allclose(got.mean[b, :, 0].detach().numpy(), mean, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got.stddev[b, :, 0].detach().numpy(), std, rtol=1e-9, atol=1e-9)


def test_a_target_on_a_context_point_gets_the_observed_value_with_a_small_std():
    torch.manual_seed(1)
    layer = kriging(nugget=1e-3, jitter=1e-6)
    xc = torch.rand(1, 8, 2, dtype=torch.float64) * 4
    yc = torch.randn(1, 8, 1, dtype=torch.float64)
    context = Normal(torch.zeros(1, 8, 1, dtype=torch.float64), torch.ones(1, 8, 1, dtype=torch.float64))
    got = layer(layer.condition(xc, yc, torch.ones(1, 8, dtype=torch.bool), context), xc, context)
    torch.testing.assert_close(got.mean, yc, atol=0.05, rtol=0)
    assert (got.stddev < 0.1).all()


def test_no_context_point_leaves_the_predictive_unchanged():
    layer = kriging()
    xc, yc = torch.zeros(2, 3, 2, dtype=torch.float64), torch.ones(2, 3, 1, dtype=torch.float64)
    context = Normal(torch.zeros(2, 3, 1, dtype=torch.float64), torch.ones(2, 3, 1, dtype=torch.float64))
    dist = Normal(torch.randn(2, 4, 1, dtype=torch.float64), torch.ones(2, 4, 1, dtype=torch.float64))
    got = layer(layer.condition(xc, yc, torch.zeros(2, 3, dtype=torch.bool), context), torch.rand(2, 4, 2), dist)
    torch.testing.assert_close(got.mean, dist.mean)
    torch.testing.assert_close(got.stddev, dist.stddev * (1 + layer.nugget.detach()) ** 0.5)


def model_spec() -> dict:
    return {
        "dim_x": 2,
        "dim_y": {"grid": 1, "stations": 1},
        "target_source": "stations",
        "dim": 16,
        "grid": {"lower": [0.0, 0.0], "upper": [4.0, 4.0], "shape": [4, 4]},
        "encoder": "mlp",
        "grid_encoder": {"name": "pseudo_token", "heads": 2},
        "processor": {"name": "swin", "layers": 1, "window": 2, "shift": 1, "heads": 2},
        "grid_decoder": {"name": "knn", "k": 4, "heads": 2},
        "likelihood": "gaussian",
        "residual": {"name": "interpolation", "sources": ["grid"], "k": 4, "spread": "stations"},
        "kriging": {"name": "gp", "source": "stations", "grid": GRID, "rank": 4},
    }


def test_model_kriged_forward_chunked_equals_forward_and_trains_the_features():
    torch.manual_seed(2)
    model = build_model(model_spec())

    def obs(n):
        return Observations(torch.rand(2, n, 2) * 4, torch.randn(2, n, 1), torch.ones(2, n, dtype=torch.bool))

    context = {"grid": obs(16), "stations": obs(5)}
    context["stations"].mask[1, 3:] = False
    xt = torch.rand(2, 37, 2) * 4
    whole = model(context, xt)
    chunked = model.forward_chunked(context, xt, chunk=8)
    torch.testing.assert_close(chunked.mean, whole.mean)
    torch.testing.assert_close(chunked.stddev, whole.stddev)
    whole.log_prob(torch.zeros_like(whole.mean)).mean().backward()
    assert model.kriging.features.table.grad.abs().sum() > 0
    assert torch.isfinite(model.kriging.log_scales.grad).all()


def test_errors_name_what_is_allowed():
    with pytest.raises(ConfigError, match=r"source must be one of the model's context sources \['grid', 'stations'\]"):
        build_model({**model_spec(), "kriging": {"name": "gp", "source": "station", "grid": GRID}})
    with pytest.raises(ConfigError, match="needs grid"):
        build_model({**model_spec(), "kriging": {"name": "gp", "source": "stations"}})
    with pytest.raises(ConfigError, match="nugget > jitter"):
        build_model({**model_spec(), "kriging": {"name": "gp", "source": "stations", "grid": GRID, "nugget": 0.0}})
    with pytest.raises(ConfigError, match=r"Unknown kriging 'krig'.*gp"):
        build_model({**model_spec(), "kriging": {"name": "krig", "source": "stations", "grid": GRID}})


def test_a_correlation_that_is_not_positive_definite_names_jitter():
    layer = kriging(nugget=2e-9, jitter=1e-9).float()
    xc = torch.zeros(1, 40, 2)  # forty copies of one point: C is all ones, rank one
    context = Normal(torch.zeros(1, 40, 1), torch.ones(1, 40, 1))
    with pytest.raises(ValueError, match="raise jitter"):
        layer.condition(xc, torch.randn(1, 40, 1), torch.ones(1, 40, dtype=torch.bool), context)


def test_a_context_without_the_kriged_source_gets_the_networks_mean():
    torch.manual_seed(3)
    model = build_model(model_spec())
    grid = Observations(torch.rand(2, 16, 2) * 4, torch.randn(2, 16, 1), torch.ones(2, 16, dtype=torch.bool))
    xt = torch.rand(2, 9, 2) * 4
    got = model({"grid": grid}, xt)
    network = model._decode(*model._encode({"grid": grid}), xt)
    torch.testing.assert_close(got.mean, network.mean)
    torch.testing.assert_close(got.stddev, network.stddev * (1 + model.kriging.nugget.detach()) ** 0.5)


def test_context_points_among_the_targets_are_decoded_once_with_the_same_result():
    torch.manual_seed(4)
    model = build_model(model_spec())
    stations = Observations(torch.rand(2, 5, 2) * 4, torch.randn(2, 5, 1), torch.ones(2, 5, dtype=torch.bool))
    stations.mask[1, 3:] = False
    grid = Observations(torch.rand(2, 16, 2) * 4, torch.randn(2, 16, 1), torch.ones(2, 16, dtype=torch.bool))
    xt = torch.cat([torch.rand(2, 7, 2) * 4, stations.x[:, [2, 0, 1]], stations.x[:1, [4, 3]].expand(2, -1, -1)], 1)
    # every valid station is a target (task 1's padded slots 3 and 4 are not)
    context = {"grid": grid, "stations": stations}
    calls = []
    hook = model.likelihood.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    once = model(context, xt)
    hook.remove()
    assert calls == [xt.shape[1]]  # the targets alone were decoded
    twice = model.forward_chunked(context, xt, chunk=4)  # decodes the context points apart
    torch.testing.assert_close(once.mean, twice.mean)
    torch.testing.assert_close(once.stddev, twice.stddev)


def test_scales_lr_scale_keeps_the_initial_layer_and_moves_the_nugget_faster():
    """The same scales at initialisation; one Adam step moves log(nu - jitter) by about lr * scales_lr_scale."""
    steps = {}
    for s in (1.0, 10.0):
        layer = kriging(nugget=0.05, scales_lr_scale=s)
        before = layer.scales().detach().clone()
        assert torch.allclose(before, kriging(nugget=0.05).scales().detach())
        optimiser = torch.optim.Adam([layer.log_scales], lr=1e-3)
        (-layer.nugget).backward()  # a loss that wants a larger nugget
        optimiser.step()
        steps[s] = float(layer.scales().detach()[3] - before[3])
    assert steps[1.0] == pytest.approx(1e-3, rel=1e-3)
    assert steps[10.0] == pytest.approx(1e-2, rel=1e-3)
