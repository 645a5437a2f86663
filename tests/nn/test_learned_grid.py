"""The learned_grid embedding: exact rows on lattice points, multilinear in between, edges, wrap, gradients, errors."""

import pytest
import torch

from gridtnp.registry import build

BOX = {"lower": [50.0, -10.0], "upper": [58.0, 2.0], "shape": [33, 49]}


def lattice(**kwargs):
    return build("embedding", "learned_grid", **{"dim_x": 2, "grid": BOX, "channels": 3, "lr_scale": 4.0, **kwargs})


def test_lattice_points_read_their_own_row():
    e = lattice()
    i, j = torch.meshgrid(torch.arange(33), torch.arange(49), indexing="ij")
    x = torch.stack([50.0 + 0.25 * i, -10.0 + 0.25 * j], -1).reshape(1, -1, 2)
    torch.testing.assert_close(e(x)[0], e.table * e.lr_scale, rtol=0, atol=1e-6)


def test_between_points_is_bilinear():
    e = lattice().double()
    table = (e.table * e.lr_scale).detach().view(33, 49, 3)
    x = torch.rand(2, 200, 2, dtype=torch.float64) * torch.tensor([8.0, 12.0]) + torch.tensor([50.0, -10.0])
    u = (x - torch.tensor([50.0, -10.0])) / 0.25
    i0, j0 = u[..., 0].floor().long().clamp(max=31), u[..., 1].floor().long().clamp(max=47)
    a, b = (u[..., 0] - i0).unsqueeze(-1), (u[..., 1] - j0).unsqueeze(-1)
    expected = (
        (1 - a) * (1 - b) * table[i0, j0]
        + (1 - a) * b * table[i0, j0 + 1]
        + a * (1 - b) * table[i0 + 1, j0]
        + a * b * table[i0 + 1, j0 + 1]
    )
    torch.testing.assert_close(e(x), expected)


def test_outside_the_box_holds_the_edge_value():
    e = lattice()
    table = (e.table * e.lr_scale).detach().view(33, 49, 3)
    x = torch.tensor([[[40.0, -20.0], [70.0, 30.0], [54.0, -30.0]]])
    out = e(x)[0]
    torch.testing.assert_close(out[0], table[0, 0])
    torch.testing.assert_close(out[1], table[32, 48])
    torch.testing.assert_close(out[2], table[16, 0])


def test_rolled_dimension_wraps():
    e = build(
        "embedding",
        "learned_grid",
        dim_x=1,
        grid={"lower": [0.0], "upper": [360.0], "shape": [4], "roll": [True]},
        channels=2,
    )
    # Points at 0, 90, 180, 270; 315 is halfway between the last point and the first, and -45 is the same place.
    out = e(torch.tensor([[[315.0], [-45.0], [360.0]]]))[0]
    torch.testing.assert_close(out[0], (e.table[3] + e.table[0]) / 2)
    torch.testing.assert_close(out[1], out[0])
    torch.testing.assert_close(out[2], e.table[0].detach())


def test_only_the_surrounding_rows_get_gradients():
    e = lattice()
    e(torch.tensor([[[51.1, -9.9]]])).sum().backward()
    touched = e.table.grad.abs().sum(-1).nonzero().flatten().tolist()
    assert touched == [4 * 49 + 0, 4 * 49 + 1, 5 * 49 + 0, 5 * 49 + 1]


def test_in_a_composite_encoder():
    encoder = build(
        "encoder",
        "mlp",
        dim_x=2,
        dim_y=1,
        dim=8,
        embed={
            "name": "composite",
            "parts": [
                {"name": "spherical_harmonics", "dims": [0, 1], "legendre_polynomials": 3},
                {"name": "learned_grid", "dims": [0, 1], "grid": BOX, "channels": 4},
            ],
        },
    )
    assert encoder.embed.out_dim == 9 + 4
    assert encoder(torch.tensor([[[52.0, -3.0]]]), torch.ones(1, 1, 1)).shape == (1, 1, 8)


def test_lr_scale_keeps_the_initial_features_and_scales_the_step():
    large = lattice(lr_scale=10.0)
    assert abs((large.table * 10.0).std().item() - 1.0) < 0.05
    x = torch.tensor([[[52.0, -3.0]]])  # on a lattice point: one row, weight 1
    before = large(x).detach()
    optimiser = torch.optim.Adam(large.parameters(), lr=1e-3)
    large(x).sum().backward()
    optimiser.step()
    # One Adam step moves each touched parameter by lr; the features move lr_scale times as far.
    torch.testing.assert_close(before - large(x).detach(), torch.full((1, 1, 3), 1e-2), rtol=1e-3, atol=1e-6)


def test_errors_are_actionable():
    with pytest.raises(ValueError, match="one dimension per input dim"):
        build("embedding", "learned_grid", dim_x=3, grid=BOX)
    with pytest.raises(ValueError, match="channels >= 1"):
        lattice(channels=0)
    with pytest.raises(ValueError, match="lr_scale > 0"):
        lattice(lr_scale=0.0)
