"""Separable SetConv sums (gridtnp.nn.setconv) against the dense formula ``se_weights`` in float64."""

from __future__ import annotations

import pytest
import torch

from gridtnp.nn.grids import Grid, se_weights
from gridtnp.nn.setconv import grid_interpolate, grid_sum

GRIDS = {
    "1d": Grid([-1.0], [2.0], [7]),
    "2d_rolled": Grid([-1.0, 0.0], [1.0, 6.0], [5, 6], roll=[False, True]),
    "3d": Grid([0.0, -1.0, 0.0], [1.0, 1.0, 2.0], [3, 4, 5], roll=[False, True, False]),
}


def inputs(grid: Grid, channels: int, n: int = 11) -> tuple[torch.Tensor, ...]:
    """Points (some outside the grid, some masked with NaN x), values and length-scales."""
    g = torch.Generator().manual_seed(channels)
    lo, hi = torch.tensor(grid.lower), torch.tensor(grid.upper)
    x = lo - 0.3 + (hi - lo + 0.6) * torch.rand(2, n, grid.ndim, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, -3:] = False
    x[1, -1] = float("nan")
    values = torch.randn(2, n, channels, generator=g, dtype=torch.float64)
    ls = (0.3 + torch.rand(grid.ndim, generator=g)).requires_grad_(True)
    return x, mask, values.requires_grad_(True), ls


def dense_sum(x, grid, ls, values, mask):
    """The formula the encoder used before: ``se_weights(...)^T @ values`` in float64."""
    return se_weights(x, grid, ls, mask).double().transpose(1, 2) @ values


@pytest.mark.parametrize("name", list(GRIDS))
@pytest.mark.parametrize("channels", [1, 2, 9])  # narrow (values folded into the factors) and wide (full weights)
@pytest.mark.parametrize("chunk_size", [4, 4096])
def test_grid_sum_matches_dense_weights(name: str, channels: int, chunk_size: int) -> None:
    grid = GRIDS[name]
    x, mask, values, ls = inputs(grid, channels)
    h = grid_sum(x, grid, ls, values, mask, chunk_size=chunk_size)
    ref = dense_sum(x, grid, ls, values, mask)
    assert h.shape == (2, grid.num_points, channels) and h.dtype == torch.float32
    torch.testing.assert_close(h.double(), ref, atol=1e-6, rtol=1e-5)
    # Same gradients for the length-scales and the values.
    w = torch.randn_like(ref)
    g_new = torch.autograd.grad((h.double() * w).sum(), [ls, values])
    g_ref = torch.autograd.grad((ref * w).sum(), [ls, values])
    for a, b in zip(g_new, g_ref, strict=True):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(GRIDS))
def test_grid_interpolate_matches_dense_weights(name: str) -> None:
    grid = GRIDS[name]
    x, _, _, ls = inputs(grid, 3)
    x = torch.nan_to_num(x)
    u = torch.randn(2, grid.num_points, 6, dtype=torch.float64, requires_grad=True)
    out = grid_interpolate(x, grid, ls, u, chunk_size=4)
    ref = se_weights(x, grid, ls).double() @ u
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-5)
    w = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad((out.double() * w).sum(), [ls, u]),
        torch.autograd.grad((ref * w).sum(), [ls, u]),
        strict=True,
    ):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-4)


def test_masked_points_add_nothing() -> None:
    grid = GRIDS["2d_rolled"]
    x, mask, values, ls = inputs(grid, 2)
    full = grid_sum(x, grid, ls, values, mask)
    kept = grid_sum(x[1:, :-3], grid, ls, values[1:, :-3], mask[1:, :-3])
    torch.testing.assert_close(full[1:], kept)
    assert torch.isfinite(full).all()


def test_wrong_input_dimension_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="input dimension"):
        grid_sum(torch.zeros(1, 3, 3), GRIDS["2d_rolled"], torch.ones(2), torch.zeros(1, 3, 1))
