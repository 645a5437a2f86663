"""GP conditioning of departures (``gridtnp.nn.conditioning``): the masked batched solve against numpy's closed form,
the rank-one closed form against the general solve, the errors, and the parameter names its three users keep."""

import numpy as np
import pytest
import torch

from gridtnp.nn.conditioning import condition, posterior, rank_one_posterior
from gridtnp.nn.grid_decoders.mos import MOSKrigingDecoder
from gridtnp.nn.kriging import ResidualKriging
from gridtnp.nn.residuals import InterpolationResidual


def rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * torch.cdist(a, b).square())


def test_posterior_is_the_closed_form_per_task_and_ignores_padding():
    torch.manual_seed(0)
    xc, r = torch.rand(3, 7, 2, dtype=torch.float64) * 3, torch.randn(3, 7, 2, dtype=torch.float64)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[1, 4:], valid[2] = False, False
    xc[1, 4:], r[1, 4:] = 1e3, 1e6  # padding that must not count
    nugget = torch.rand(3, 7, dtype=torch.float64) * 0.1 + 0.01  # one per point
    xt = torch.rand(3, 5, 2, dtype=torch.float64) * 3
    shift, explained = posterior(condition(rbf(xc, xc), r, valid, nugget, "test"), rbf(xt, xc))
    for b in range(3):
        ok = valid[b].numpy()
        k = rbf(xc[b : b + 1, ok], xc[b : b + 1, ok])[0].numpy() + np.diag(nugget[b, ok].numpy())
        cross = rbf(xt[b : b + 1], xc[b : b + 1, ok])[0].numpy()
        np.testing.assert_allclose(shift[b].numpy(), cross @ np.linalg.solve(k, r[b, ok].numpy()), atol=1e-12)
        want = np.einsum("tc,ct->t", cross, np.linalg.solve(k, cross.T))
        np.testing.assert_allclose(explained[b].numpy(), want, atol=1e-12)
    assert (shift[2] == 0).all() and (explained[2] == 0).all()  # no context point: the prior


def test_rank_one_posterior_is_the_solve_with_fully_correlated_neighbours():
    """Weights ``a_j / (1 + sum a_i)``: the GP posterior with ``K = 1 1^T``, ``k(x, X) = 1`` and noise ``1 / a_j``."""
    torch.manual_seed(1)
    a = torch.rand(2, 4, 3, dtype=torch.float64) * 5
    a[1, 2, 1] = 0.0  # an invalid neighbour
    d = torch.randn(2, 4, 3, 1, dtype=torch.float64)
    shift, weights = rank_one_posterior(a, d)
    ok = a > 0
    flat = lambda t: t.reshape(8, *t.shape[2:])  # noqa: E731  (one GP per target)
    ones = torch.ones(8, 3, 3, dtype=torch.float64)
    factor = condition(ones, flat(d), flat(ok), flat(a).clamp(min=1e-300).reciprocal(), "test")
    solved, explained = posterior(factor, torch.ones(8, 1, 3, dtype=torch.float64))
    torch.testing.assert_close(flat(shift), solved[:, 0])
    torch.testing.assert_close(weights.sum(-1).reshape(8), explained[:, 0])  # both are sum a / (1 + sum a)


def test_a_covariance_that_is_not_positive_definite_names_the_remedy_or_gets_jitter():
    gram = torch.ones(1, 5, 5)  # five copies of one point: rank one
    valid = torch.ones(1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^where: the context covariance .* not positive definite.*; raise it\.$"):
        condition(gram, torch.randn(1, 5, 1), valid, 0.0, "where", "raise it")
    with pytest.warns(match="added jitter"):
        factor = condition(gram, torch.randn(1, 5, 1), valid, 0.0, "where")
    assert torch.isfinite(factor.weights).all()


def test_the_three_users_keep_their_parameter_names():
    """Checkpoints saved before the shared solve load unchanged: the parameters stay with their users."""
    grid = {"lower": [0.0, 0.0], "upper": [1.0, 1.0], "shape": [2, 2]}
    kriging = ResidualKriging("stations", 2, 1, {"stations": 1}, grid=grid)
    assert set(kriging.state_dict()) == {"features.table", "log_scales"}
    mos = MOSKrigingDecoder(grid, sources=["grid", "stations"])
    assert {"log_noise", "kernel.raw_outputscale", "kernel.base_kernel.raw_lengthscale"} <= set(mos.state_dict())
    residual = InterpolationResidual(["grid"], 1, {"grid": 1, "stations": 1}, departures={"source": "stations"})
    assert "log_departure_scale" in residual.state_dict()
