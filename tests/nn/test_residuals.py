"""Residual prediction over a context interpolation: the interpolation against brute force, exactness, masking, and
the model's mean shifted by it (std unchanged), with actionable errors."""

import math

import pytest
import torch

from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.models.specs import expand_spec
from gridtnp.nn.monomials import basis_size, shape_basis
from gridtnp.nn.residual_options import Departures, Regression
from gridtnp.nn.residuals import InterpolationResidual, shift_mean
from gridtnp.registry import ConfigError


def brute_force(sources, xt, k, lengthscale, weight):
    """Every distance, the k nearest valid points of each source by sorting, weighted Gaussians: one target at a
    time. ``sources``: ``[(x [B, N, Dx], y [B, N, Dy], valid [B, N])]``; ``lengthscale``, ``weight``: per source.
    Returns the interpolation and each source's share of the weights."""
    out = torch.zeros(*xt.shape[:2], sources[0][1].shape[-1], dtype=xt.dtype)
    share = torch.zeros(*xt.shape[:2], len(sources), dtype=xt.dtype)
    for b in range(xt.shape[0]):
        for t in range(xt.shape[1]):
            logits, values = [], []
            for (xc, yc, valid), ell, wgt in zip(sources, lengthscale, weight, strict=True):
                points = valid[b].nonzero().flatten()
                d2 = (xt[b, t] - xc[b, points]).square().sum(-1)
                order = d2.argsort()[:k]
                logits.append(math.log(wgt) - 0.5 * d2[order] / ell**2)
                values.append(yc[b, points[order]])
            sizes = [len(v) for v in values]
            logits = torch.cat(logits)
            if len(logits):
                w = torch.softmax(logits, 0)
                out[b, t] = (w.unsqueeze(-1) * torch.cat(values)).sum(0)
                share[b, t] = torch.stack([part.sum() for part in w.split(sizes)])
    return out, share


def test_matches_brute_force_over_two_sources_with_padding():
    torch.manual_seed(0)
    xa, xb = torch.rand(3, 20, 2, dtype=torch.float64) * 4, torch.rand(3, 7, 2, dtype=torch.float64) * 4
    ya, yb = torch.randn(3, 20, 3, dtype=torch.float64), torch.randn(3, 7, 1, dtype=torch.float64)
    va, vb = torch.rand(3, 20) > 0.3, torch.rand(3, 7) > 0.5
    va[2], vb[2] = False, False  # a task with no context at all
    va[1, 3:] = False  # a task with fewer valid points than k
    xt = torch.rand(3, 11, 2, dtype=torch.float64) * 4
    interp = InterpolationResidual(
        ["a", "b"],
        dim_y=1,
        source_dims={"a": 3, "b": 1},
        k=5,
        lengthscale={"a": 0.7, "b": 0.2},
        weight={"a": 1, "b": 9},
    ).double()
    got, share, _ = interp({"a": (xa, ya, va), "b": (xb, yb, vb)}, xt)
    want, want_share = brute_force([(xa, ya[..., :1], va), (xb, yb, vb)], xt, 5, (0.7, 0.2), (1.0, 9.0))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(share, want_share)
    assert (got[2] == 0).all() and (share[2] == 0).all()


def test_each_source_keeps_its_k_nearest():
    # Three station points right at the target must not push the coarse field's two points out of the average.
    coarse = (torch.tensor([[[-1.0], [1.0]]]), torch.tensor([[[10.0], [20.0]]]), torch.ones(1, 2, dtype=torch.bool))
    stations = (torch.tensor([[[0.01], [0.02], [0.03]]]), torch.zeros(1, 3, 1), torch.ones(1, 3, dtype=torch.bool))
    interp = InterpolationResidual(
        ["coarse", "stations"],
        1,
        {"coarse": 1, "stations": 1},
        k=2,
        lengthscale=1e3,
        weight={"coarse": 1.0, "stations": 1e-9},
    )
    torch.testing.assert_close(
        interp({"coarse": coarse, "stations": stations}, torch.zeros(1, 1, 1))[0],
        torch.tensor([[[15.0]]]),
        rtol=1e-4,
        atol=1e-4,
    )


def test_targets_on_context_points_get_their_values():
    x = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    y = torch.tensor([[[2.0], [-1.0], [5.0]]])
    interp = InterpolationResidual(["s"], dim_y=1, source_dims={"s": 1}, k=3, lengthscale=0.05)
    torch.testing.assert_close(interp({"s": (x, y, torch.ones(1, 3, dtype=torch.bool))}, x)[0], y)


def test_the_share_of_an_exact_source_marks_observed_targets():
    # A target on a context station gets (nearly) all weight from the stations, one between stations from the
    # coarse field: the share the model embeds into the target tokens.
    coarse = (torch.tensor([[[0.0], [1.0]]]), torch.zeros(1, 2, 1), torch.ones(1, 2, dtype=torch.bool))
    stations = (torch.tensor([[[0.3]]]), torch.ones(1, 1, 1), torch.ones(1, 1, dtype=torch.bool))
    interp = InterpolationResidual(
        ["coarse", "stations"],
        1,
        {"coarse": 1, "stations": 1},
        k=2,
        lengthscale={"coarse": 0.5, "stations": 0.05},
        weight={"coarse": 1, "stations": 100},
    )
    mean, share, _ = interp({"coarse": coarse, "stations": stations}, torch.tensor([[[0.3], [0.7]]]))
    assert share[0, 0, 1] > 0.98 and share[0, 1, 1] < 1e-6
    torch.testing.assert_close(share.sum(-1), torch.ones(1, 2))
    assert mean[0, 0, 0] > 0.98 and mean[0, 1, 0] < 1e-6


def residual_model(residual):
    spec = {
        "dim_x": 2,
        "dim_y": {"grid": 2, "stations": 1},
        "target_source": "stations",
        "dim": 16,
        "encoder": {"name": "mlp"},
        "grid_encoder": {"name": "identity"},
        "processor": {"name": "transformer", "layers": 1},
        "grid_decoder": {"name": "cross_attention", "layers": 1},
        "likelihood": {"name": "gaussian"},
        "residual": {"name": "interpolation", **residual} if isinstance(residual, dict) else residual,
    }
    return spec, build_model(spec)


def test_model_mean_is_the_interpolation_plus_the_network():
    torch.manual_seed(1)
    _, model = residual_model({"sources": ["grid"], "k": 3, "lengthscale": 0.5})
    grid = Observations(torch.rand(2, 12, 2), torch.randn(2, 12, 2), torch.rand(2, 12) > 0.2)
    stations = Observations(torch.rand(2, 5, 2), torch.randn(2, 5, 1))
    xt = torch.rand(2, 6, 2)
    with_residual = model({"grid": grid, "stations": stations}, xt)
    interpolation, _, _ = model.residual(
        {"grid": (grid.x * grid.mask[..., None], grid.y * grid.mask[..., None], grid.mask)}, xt
    )
    residual, model.residual = model.residual, None
    plain = model({"grid": grid, "stations": stations}, xt)
    torch.testing.assert_close(with_residual.mean, plain.mean + interpolation)
    torch.testing.assert_close(with_residual.stddev, plain.stddev)
    loss = -with_residual.log_prob(torch.zeros(2, 6, 1)).sum()
    model.residual = residual
    assert residual.log_lengthscale.grad is None
    (-model({"grid": grid, "stations": stations}, xt).log_prob(torch.zeros(2, 6, 1)).sum()).backward()
    assert residual.log_lengthscale.grad is not None and torch.isfinite(loss)
    # The shares' embedding starts at zero (so the test above holds) and is trained.
    assert residual.features.weight.grad is not None and residual.features.weight.grad.abs().sum() > 0


def test_spec_round_trip_and_errors():
    spec, model = residual_model({"sources": ["grid"]})
    expanded = expand_spec(spec)
    assert expanded["residual"]["name"] == "interpolation" and expanded["residual"]["sources"] == ["grid"]
    assert expanded["residual"]["k"] == 4 and expanded["residual"]["source_dims"] == {"grid": 2, "stations": 1}
    assert sum(p.numel() for p in build_model(expanded).parameters()) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ConfigError, match="model's context sources"):
        residual_model({"sources": ["radar"]})
    with pytest.raises(ConfigError, match="unknown argument"):
        residual_model({"sources": ["grid"], "kernel": "se"})
    with pytest.raises(ConfigError, match="mapping with a 'name' key"):
        residual_model(["grid"])
    with pytest.raises(ConfigError, match="k >= 1"):
        residual_model({"sources": ["grid"], "k": 0})
    with pytest.raises(ConfigError, match="one per source"):
        residual_model({"sources": ["grid"], "lengthscale": {"stations": 0.1}})
    with pytest.raises(ConfigError, match="finite and > 0"):
        residual_model({"sources": ["grid"], "weight": 0.0})


def test_departures_spread_observed_anomalies_like_residual_kriging():
    torch.manual_seed(0)
    coarse = (torch.rand(2, 30, 2) * 4, torch.randn(2, 30, 1), torch.ones(2, 30, dtype=torch.bool))
    xs = torch.rand(2, 6, 2) * 4
    stations = (xs, torch.randn(2, 6, 1), torch.tensor([[True] * 6, [True] * 4 + [False] * 2]))
    stations = (xs * stations[2][..., None], stations[1] * stations[2][..., None], stations[2])
    interp = InterpolationResidual(
        ["coarse"],
        1,
        {"coarse": 1, "stations": 1},
        k=4,
        lengthscale=0.5,
        dim=8,
        departures={"source": "stations", "k": 3, "lengthscale": 0.7, "weight": 5.0},
    )
    context = {"coarse": coarse, "stations": stations}
    xt = torch.cat([xs[:, :3], torch.rand(2, 5, 2) * 4], 1)
    got, features, _ = interp(context, xt)
    background, share = interp._weighted(interp._neighbours(context, xt))
    # Brute force: each target's 3 nearest valid stations, departures from the background at the stations.
    want = background.clone()
    at_stations, _ = interp._weighted(interp._neighbours(context, xs))
    for b in range(2):
        ok = stations[2][b].nonzero().flatten()
        dep = stations[1][b, ok] - at_stations[b, ok]
        for t in range(xt.shape[1]):
            d2 = (xt[b, t] - xs[b, ok]).square().sum(-1)
            near = d2.argsort()[:3]
            a = 5.0 * torch.exp(-0.5 * d2[near] / 0.7**2)
            lam = a / (1 + a.sum())
            want[b, t] += (lam[:, None] * dep[near]).sum(0)
            torch.testing.assert_close(features[b, t, 1], lam.sum())
            torch.testing.assert_close(features[b, t, 3], (lam * dep[near, 0].square()).sum())
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(features[..., :1], share)
    assert features.shape[-1] == interp.num_features == 4
    # A large weight makes the prediction at an observed station (nearly) its observation.
    exact = InterpolationResidual(
        ["coarse"],
        1,
        {"coarse": 1, "stations": 1},
        k=4,
        lengthscale=0.5,
        departures={"source": "stations", "k": 3, "lengthscale": 0.05, "weight": 1e4},
    )
    torch.testing.assert_close(exact(context, xs)[0][0], stations[1][0], atol=2e-3, rtol=0)


def test_departures_spec_round_trip_and_errors():
    departures = {"source": "stations", "k": 6}
    spec, model = residual_model({"sources": ["grid"], "departures": departures})
    expanded = expand_spec(spec)
    assert expanded["residual"]["departures"] == departures
    assert sum(p.numel() for p in build_model(expanded).parameters()) == sum(p.numel() for p in model.parameters())
    grid = Observations(torch.rand(2, 12, 2), torch.randn(2, 12, 2))
    stations = Observations(torch.rand(2, 5, 2), torch.randn(2, 5, 1), torch.rand(2, 5) > 0.5)
    dist = model({"grid": grid, "stations": stations}, torch.rand(2, 7, 2))
    dist.log_prob(torch.zeros(2, 7, 1)).sum().backward()
    assert model.residual.log_departure_scale.grad is not None
    for bad, match in (
        ({"source": "grid"}, "not among the interpolated"),
        ({"source": "radar"}, "departures.source"),
        ({"source": "stations", "kernel": "se"}, "departures has no option 'kernel'; allowed: source \\(required"),
        ({"k": 3}, "departures needs 'source'"),
        ({"source": "stations", "k": 0}, "departures.k"),
        ({"source": "stations", "lengthscale": -1.0}, "departures.lengthscale"),
    ):
        with pytest.raises(ConfigError, match=match):
            residual_model({"sources": ["grid"], "departures": bad})


def test_adaptive_reweights_neighbours_by_direction():
    # Zero at initialisation; with a coefficient on the first input dimension, neighbours on the +x side gain
    # weight exp(c o_x): checked against the softmax written out, and the gradient reaches the map.
    coarse_x = torch.tensor([[[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    coarse = (coarse_x, torch.tensor([[[0.0], [10.0], [4.0]]]), torch.ones(1, 3, dtype=torch.bool))
    interp = InterpolationResidual(["coarse"], 1, {"coarse": 1}, k=3, lengthscale=2.0, dim=4, adaptive=True, dim_x=2)
    xt, zt = torch.zeros(1, 1, 2), torch.ones(1, 1, 4)
    _, _, near = interp({"coarse": coarse}, xt)
    assert (interp.adapt(near, zt) == 0).all()
    with torch.no_grad():
        interp.direction.bias.copy_(torch.tensor([0.8, 0.0, 0.0, 0.0]))  # c . [o_x, o_y, o_x^2, o_y^2]
    offsets = coarse_x[0] / 2.0
    base = torch.softmax(-0.5 * offsets.square().sum(-1), 0)
    adapted = torch.softmax(-0.5 * offsets.square().sum(-1) + 0.8 * offsets[:, 0], 0)
    values = coarse[1][0, :, 0]
    change = interp.adapt(near, zt)
    torch.testing.assert_close(change, ((adapted - base) * values).sum().view(1, 1, 1))
    assert change.item() > 0  # the +x neighbour holds the largest value
    change.sum().backward()
    assert interp.direction.weight.grad.abs().sum() > 0


def test_adaptive_model_matches_plain_at_initialisation_and_round_trips():
    torch.manual_seed(2)
    spec, model = residual_model({"sources": ["grid"], "k": 3, "adaptive": True})
    assert expand_spec(spec)["residual"]["adaptive"] is True
    grid = Observations(torch.rand(2, 12, 2), torch.randn(2, 12, 2))
    stations = Observations(torch.rand(2, 5, 2), torch.randn(2, 5, 1))
    xt = torch.rand(2, 6, 2)
    adaptive = model({"grid": grid, "stations": stations}, xt)
    model.residual.adaptive = False
    torch.testing.assert_close(adaptive.mean, model({"grid": grid, "stations": stations}, xt).mean)
    with pytest.raises(ConfigError, match="adaptive must be true or false"):
        residual_model({"sources": ["grid"], "adaptive": "yes"})


def test_spread_scales_the_std_by_the_days_station_departures():
    # nu^2 = (sum_j d_j^2 + c nu_0^2) / (n + c), d_j = station value - interpolation of the coarse source at the
    # station (brute force); the factor (nu / nu_0)^alpha is 1 at initialisation (alpha = 0).
    torch.manual_seed(5)
    coarse = (torch.randn(2, 6, 2), torch.randn(2, 6, 1), torch.ones(2, 6, dtype=torch.bool))
    valid = torch.tensor([[True, True, False, True], [False, False, False, False]])  # task 2: no station
    stations = (torch.randn(2, 4, 2), torch.randn(2, 4, 1) * valid.unsqueeze(-1), valid)
    interp = InterpolationResidual(
        ["coarse", "stations"], 1, {"coarse": 1, "stations": 1}, k=3, lengthscale=0.8, dim=4, spread="stations"
    )
    xt = torch.randn(2, 5, 2)
    _, _, near = interp({"coarse": coarse, "stations": stations}, xt)
    torch.testing.assert_close(near.spread, torch.ones(2, 1, 1))
    with torch.no_grad():
        interp.spread_scale.copy_(torch.tensor([math.log(0.3), 1.5]))
    _, _, near = interp({"coarse": coarse, "stations": stations}, xt)
    at_stations, _ = brute_force([coarse], stations[0], 3, [0.8], [1.0])
    d2 = ((stations[1] - at_stations)[..., 0] ** 2 * valid).sum(-1)
    nu = ((d2 + 4 * 0.3**2) / (valid.sum(-1) + 4)).sqrt()
    torch.testing.assert_close(near.spread.view(2), (nu / 0.3) ** 1.5)
    assert near.spread[1].item() == pytest.approx(1.0)  # no station in the task: nu = nu_0
    near.spread.sum().backward()
    assert interp.spread_scale.grad.abs().sum() > 0


def test_spread_model_scales_only_the_std_and_round_trips():
    torch.manual_seed(6)
    spec, model = residual_model({"sources": ["grid", "stations"], "k": 3, "spread": "stations"})
    assert expand_spec(spec)["residual"]["spread"] == "stations"
    grid = Observations(torch.rand(2, 12, 2), torch.randn(2, 12, 2))
    stations = Observations(torch.rand(2, 5, 2), torch.randn(2, 5, 1))
    xt = torch.rand(2, 6, 2)
    before = model({"grid": grid, "stations": stations}, xt)
    with torch.no_grad():
        model.residual.spread_scale[1] = 1.0
    after = model({"grid": grid, "stations": stations}, xt)
    torch.testing.assert_close(after.mean, before.mean)
    ratio = after.stddev / before.stddev
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio))  # one factor per task
    assert not torch.allclose(ratio, torch.ones_like(ratio))
    _, unlisted = residual_model({"sources": ["grid"], "k": 3, "spread": "stations"})  # measured, not interpolated
    with torch.no_grad():
        unlisted.residual.spread_scale[1] = 1.0
    assert unlisted({"grid": grid, "stations": stations}, xt).stddev.isfinite().all()
    for bad, match in (
        ({"sources": ["stations"], "spread": "stations"}, "another source must be listed in sources"),
        ({"sources": ["grid", "stations"], "spread": "coarse"}, r"spread must name a context source \['grid'"),
    ):
        with pytest.raises(ConfigError, match=match):
            residual_model(bad)


def test_the_spread_factor_widens_the_std_without_reweighting_the_mean():
    # Same values as N(mean + offset, std * scale); the mean's gradient of -log p is (mean - y) / std^2, as without
    # the factor, while the std's gradient sees the widened std.
    loc, std = torch.tensor([[[0.5], [1.0]]], requires_grad=True), torch.tensor([[[0.4], [2.0]]], requires_grad=True)
    offset, scale, y = torch.tensor([[[0.1], [-0.2]]]), torch.tensor([[[3.0]]]), torch.tensor([[[0.0], [1.5]]])
    dist = shift_mean(torch.distributions.Normal(loc, std), offset, scale)
    torch.testing.assert_close(dist.mean, loc.detach() + offset)
    torch.testing.assert_close(dist.stddev, std.detach() * 3.0)
    (-dist.log_prob(y)).sum().backward()
    torch.testing.assert_close(loc.grad, (loc.detach() + offset - y) / std.detach() ** 2)
    wide = std.detach() * 3.0
    expected_std_grad = 3.0 * (1 / wide - (loc.detach() + offset - y) ** 2 / wide**3)
    torch.testing.assert_close(std.grad, expected_std_grad)


def test_spread_power_is_checked_and_needs_spread():
    for bad, match in (
        ({"sources": ["grid", "stations"], "spread": "stations", "spread_power": float("nan")}, "spread_power must be"),
        ({"sources": ["grid", "stations"], "spread": "stations", "spread_power": True}, "spread_power must be"),
        ({"sources": ["grid", "stations"], "spread_power": 1.0}, "spread_power .* needs spread"),
    ):
        with pytest.raises(ConfigError, match=match):
            residual_model(bad)
    spec, _ = residual_model({"sources": ["grid", "stations"], "spread": "stations", "spread_power": -1})
    assert expand_spec(spec)["residual"]["spread_power"] == -1.0


LATTICE = {"lower": [-2.0, -2.0], "upper": [2.0, 2.0], "shape": [5, 5]}


def test_shape_basis_lists_offsets_squares_and_products():
    torch.testing.assert_close(shape_basis(torch.tensor([[2.0, 3.0]])), torch.tensor([[2.0, 3.0, 4.0, 9.0, 6.0]]))
    assert shape_basis(torch.ones(4, 3)).shape == (4, 9)  # 3 offsets, 3 squares, 3 products


def test_shape_basis_degrees_one_three_and_four():
    o = torch.tensor([[2.0, 3.0]])
    torch.testing.assert_close(shape_basis(o, 1), o)
    cubic = torch.tensor([[2.0, 3.0, 4.0, 9.0, 6.0, 8.0, 12.0, 18.0, 27.0]])  # ..., x^3, x^2 y, x y^2, y^3
    torch.testing.assert_close(shape_basis(o, 3), cubic)
    quartic = torch.tensor([[16.0, 24.0, 36.0, 54.0, 81.0]])  # x^4, x^3 y, x^2 y^2, x y^3, y^4
    torch.testing.assert_close(shape_basis(o, 4), torch.cat([cubic, quartic], -1))
    for dx, degree in ((2, 1), (2, 2), (2, 3), (2, 4), (3, 2), (3, 3)):
        assert shape_basis(torch.ones(1, dx), degree).shape[-1] == basis_size(dx, degree)


def test_regression_adds_the_place_coefficients_times_the_local_shape():
    # correction = a_coarse (c_0(x) + sum_p c_p(x) g_p), g_p = sum_j w_j phi_p(o_j) (y_j - m), written out for one
    # target on a lattice point (so c(x) is that point's row), with the weights renormalised within the source.
    torch.manual_seed(7)
    coarse = (torch.randn(1, 6, 2), torch.randn(1, 6, 1), torch.tensor([[True, True, False, True, True, True]]))
    stations = (torch.randn(1, 3, 2), torch.randn(1, 3, 1), torch.ones(1, 3, dtype=torch.bool))
    context = {"coarse": coarse, "stations": stations}
    kwargs = {"k": 3, "lengthscale": {"coarse": 1.5, "stations": 0.6}, "dim": 4}
    plain = InterpolationResidual(["coarse", "stations"], 1, {"coarse": 1, "stations": 1}, **kwargs)
    interp = InterpolationResidual(
        ["coarse", "stations"], 1, {"coarse": 1, "stations": 1}, **kwargs, regression={"grid": LATTICE}
    )
    assert interp.regression.sources == ("coarse",)  # default: the first interpolated source
    assert interp.regression.lengthscale is None  # default: the interpolation's, shared
    interp = InterpolationResidual(
        ["coarse", "stations"],
        1,
        {"coarse": 1, "stations": 1},
        **kwargs,
        regression={"grid": LATTICE, "lengthscale": 2},
    )
    xt = torch.tensor([[[1.0, -1.0]]])
    torch.testing.assert_close(interp(context, xt)[0], plain(context, xt)[0])  # zero at initialisation
    row = torch.tensor([0.3, 1.0, -0.5, 0.2, 0.4, -0.7])  # c_0 and the 5 shape coefficients
    with torch.no_grad():
        interp.coefficients.table[3 * 5 + 1] = row / interp.coefficients.lr_scale  # lattice point (1, -1)
    mean, share, _ = interp(context, xt)
    points = coarse[2][0].nonzero().flatten()
    d2 = (xt[0, 0] - coarse[0][0, points]).square().sum(-1)
    near = d2.argsort()[:3]
    w = torch.softmax(-0.5 * d2[near] / 2.0**2, 0)  # the regression's own lengthscale, 2
    y = coarse[1][0, points[near], 0]
    phi = shape_basis((coarse[0][0, points[near]] - xt[0, 0]) / 2.0)  # [3, 5]
    g = (w[:, None] * phi * (y - (w * y).sum())[:, None]).sum(0)
    expected = plain(context, xt)[0] + share[..., :1] * (row[0] + (row[1:] * g).sum())
    torch.testing.assert_close(mean, expected)


def test_regression_position_makes_the_coefficients_polynomials_of_the_offset_to_the_nearest_point():
    # position 1, degree 1: correction = a (sum_q c_0q psi_q(u) + sum_p sum_q c_pq psi_q(u) g_p), psi = [1, u_1, u_2],
    # u the target minus its nearest valid coarse point, in the regression's lengthscale (here the interpolation's).
    torch.manual_seed(9)
    coarse = (torch.randn(1, 6, 2), torch.randn(1, 6, 1), torch.tensor([[True, False, True, True, True, True]]))
    context = {"coarse": coarse}
    kwargs = {"k": 4, "lengthscale": 1.5, "dim": 4}
    plain = InterpolationResidual(["coarse"], 1, {"coarse": 1}, **kwargs)
    interp = InterpolationResidual(
        ["coarse"], 1, {"coarse": 1}, **kwargs, regression={"grid": LATTICE, "degree": 1, "position": 1}
    )
    assert interp.coefficients.table.shape[-1] == (1 + 2) * (1 + 2)
    row = torch.arange(9.0) / 10 - 0.3  # [(1 + P) x Q] in that order
    with torch.no_grad():
        interp.coefficients.table[3 * 5 + 1] = row / interp.coefficients.lr_scale  # lattice point (1, -1)
    xt = torch.tensor([[[1.0, -1.0]]])
    mean, share, _ = interp(context, xt)
    points = coarse[2][0].nonzero().flatten()
    d2 = (xt[0, 0] - coarse[0][0, points]).square().sum(-1)
    near = d2.argsort()[:4]
    w = torch.softmax(-0.5 * d2[near] / 1.5**2, 0)
    y = coarse[1][0, points[near], 0]
    o = (coarse[0][0, points[near]] - xt[0, 0]) / 1.5  # [4, 2]
    g = torch.cat([torch.ones(1), (w[:, None] * o * (y - (w * y).sum())[:, None]).sum(0)])  # [1 + P]
    psi = torch.cat([torch.ones(1), -o[0]])  # the nearest point comes first
    expected = plain(context, xt)[0] + share * (row.view(3, 3) * g[:, None] * psi[None]).sum()
    torch.testing.assert_close(mean, expected)
    for key, bad in (("degree", 0), ("degree", 5), ("degree", True), ("position", -1), ("position", 1.5)):
        with pytest.raises(ValueError, match=f"regression.{key} must be an integer"):
            InterpolationResidual(["coarse"], 1, {"coarse": 1}, regression={"grid": LATTICE, key: bad})


def test_regression_gain_scales_the_interpolated_value_per_place():
    # gain: correction = a (c_0(x) + c_g(x) m + sum_p c_p(x) g_p), m the source's weighted mean (MOS's b x); with only
    # c_g set, a target on a lattice point gets its interpolation times 1 + a c_g.
    torch.manual_seed(10)
    coarse = (torch.randn(1, 6, 2), torch.randn(1, 6, 1), torch.tensor([[True, True, True, False, True, True]]))
    kwargs = {"k": 4, "lengthscale": 1.5, "dim": 4}
    plain = InterpolationResidual(["coarse"], 1, {"coarse": 1}, **kwargs)
    interp = InterpolationResidual(
        ["coarse"], 1, {"coarse": 1}, **kwargs, regression={"grid": LATTICE, "degree": 1, "gain": True}
    )
    assert interp.coefficients.table.shape[-1] == 1 + 1 + 2  # c_0, c_g and the two gradient coefficients
    xt = torch.tensor([[[1.0, -1.0]]])
    base = plain({"coarse": coarse}, xt)[0]
    torch.testing.assert_close(interp({"coarse": coarse}, xt)[0], base)  # zero at initialisation
    points = coarse[2][0].nonzero().flatten()
    d2 = (xt[0, 0] - coarse[0][0, points]).square().sum(-1)
    near = d2.argsort()[:4]
    w = torch.softmax(-0.5 * d2[near] / 1.5**2, 0)
    m = (w * coarse[1][0, points[near], 0]).sum()
    torch.testing.assert_close(base[0, 0, 0], m)  # one source: its share a is 1 and the interpolation is m
    with torch.no_grad():
        interp.coefficients.table[3 * 5 + 1] = torch.tensor([0.0, 0.5, 0.0, 0.0]) / interp.coefficients.lr_scale
    torch.testing.assert_close(interp({"coarse": coarse}, xt)[0], 1.5 * base)
    with pytest.raises(ValueError, match=r"regression.gain must be true or false; got 'yes'"):
        InterpolationResidual(["coarse"], 1, {"coarse": 1}, regression={"grid": LATTICE, "gain": "yes"})


def test_regression_leaves_observed_stations_and_round_trips():
    torch.manual_seed(8)
    regression = {"sources": ["grid"], "grid": LATTICE, "lr_scale": 10}
    spec, model = residual_model(
        {
            "sources": ["grid", "stations"],
            "k": 3,
            "lengthscale": {"grid": 1.0, "stations": 0.05},
            "weight": {"grid": 1.0, "stations": 1e6},
            "regression": regression,
        }
    )
    assert expand_spec(spec)["residual"]["regression"] == regression
    with torch.no_grad():
        model.residual.coefficients.table.normal_()
    grid = Observations(torch.rand(2, 12, 2) * 4 - 2, torch.randn(2, 12, 2))
    stations = Observations(torch.rand(2, 5, 2) * 4 - 2, torch.randn(2, 5, 1))
    mean, _, _ = model.residual(
        {k: (o.x, o.y, o.mask) for k, o in (("grid", grid), ("stations", stations))}, stations.x
    )
    # At an observed station the coarse field's share, which scales the correction, is about 1e-6.
    torch.testing.assert_close(mean, stations.y, atol=1e-4, rtol=0)
    model({"grid": grid, "stations": stations}, torch.rand(2, 6, 2)).mean.sum().backward()
    assert model.residual.coefficients.table.grad.abs().sum() > 0
    for bad, match in (
        ({"sources": ["grid"], "regression": {"sources": ["grid"]}}, "regression needs 'grid'"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "order": 2}}, "regression has no option 'order'; al"),
        ({"sources": ["grid"], "regression": 3}, "regression must be a mapping of grid \\(required\\), sources"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "degree": 9}}, "regression.degree must be an integer"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "sources": ["stations"]}}, "regression.sources"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "lr_scale": 0}}, "regression.lr_scale must be"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "lengthscale": -1}}, "regression.lengthscale of"),
        ({"sources": ["grid"], "regression": {"grid": LATTICE, "lengthscale": {"x": 1}}}, "one number or one per"),
    ):
        with pytest.raises(ConfigError, match=match):
            residual_model(bad)


def test_typed_options_check_themselves_and_equal_the_recipe_mapping():
    """``Regression`` and ``Departures`` built in Python give the same residual as a recipe's mappings."""
    regression = {"grid": LATTICE, "lengthscale": 2.0, "degree": 1}
    departures = {"source": "stations", "k": 3}
    built = []
    for reg, dep in ((regression, departures), (Regression(**regression), Departures(**departures))):
        torch.manual_seed(0)
        built.append(InterpolationResidual(["coarse"], 1, {"coarse": 1, "stations": 1}, regression=reg, departures=dep))
    assert built[0].regression == built[1].regression == Regression.parse(regression).for_sources(["coarse"])
    assert built[0].regression.lengthscale == {"coarse": 2.0}
    assert built[0].departures == built[1].departures == Departures("stations", k=3)
    with pytest.raises(ValueError, match=r"^residual 'interpolation': regression.position must be an integer from 0"):
        Regression(grid=LATTICE, position=7)
    with pytest.raises(ValueError, match=r"^residual 'interpolation': departures.weight must be finite and > 0"):
        Departures("stations", weight=0.0)
