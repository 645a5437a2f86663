"""Gaussian kernel averaging (``gka``): dense against a hand-written loop, the k-NN variant against dense GKA.

References: the kernel-weighted mean written out per (target, point) in Python, and dense GKA over every point,
which the k-nearest-neighbour variant must equal when ``k`` covers the whole context.
"""

from __future__ import annotations

import math

import pytest
import torch

from gridtnp.nn.grid_decoders.kernel_averaging import GKADecoder
from gridtnp.nn.grids import Grid
from gridtnp.nn.tokens import Latent
from tests.conftest import grid_coords


def gka_by_hand(xt, x, z, mask, scale, bias=None, roll_period=None) -> torch.Tensor:
    """``sum_n w_n z_n / sum_n w_n`` with ``w_n = exp(-0.5 sum_d (dx_d / scale_d)^2 + bias_n)``, loops only."""
    b, nt, _ = xt.shape
    out = torch.zeros(b, nt, z.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for t in range(nt):
            logits = []
            for n in range(x.shape[1]):
                if not mask[bi, n]:
                    continue
                total = 0.0
                for d in range(x.shape[2]):
                    diff = float(xt[bi, t, d]) - float(x[bi, n, d])
                    if roll_period is not None and roll_period[d]:
                        diff = (diff + roll_period[d] / 2) % roll_period[d] - roll_period[d] / 2
                    total += (diff / float(scale[d].detach())) ** 2
                logits.append((-0.5 * total + (0.0 if bias is None else float(bias[bi, n].detach())), n))
            if not logits:
                continue
            top = max(v for v, _ in logits)
            weights = [(math.exp(v - top), n) for v, n in logits]
            norm = sum(w for w, _ in weights)
            for w, n in weights:
                out[bi, t] += w / norm * z[bi, n].double()
    return out.float()


def set_state(b=2, n=40, d=2, dz=3, seed=0) -> tuple[Latent, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(b, n, d, generator=gen) * 4 - 2
    mask = torch.rand(b, n, generator=gen) < 0.75
    z = torch.randn(b, n, dz, generator=gen)
    xt = torch.rand(b, 11, d, generator=gen) * 5 - 2.5
    return Latent(z, mask=mask, x=x), xt


@pytest.mark.parametrize("modulate", [False, True])
def test_dense_gka_matches_a_hand_written_loop(modulate):
    state, xt = set_state()
    decoder = GKADecoder(dim=3, dim_x=2, lengthscale=[0.3, 0.7], modulate=modulate)
    out = decoder([state], torch.zeros(2, 11, 3), xt)
    bias = decoder.modulation(state.x).squeeze(-1) if modulate else None
    expected = gka_by_hand(xt, state.x, state.tokens, state.mask, decoder.lengthscale, bias)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("modulate", [False, True])
def test_knn_gka_at_large_k_equals_dense_gka_over_all_points(modulate):
    state, xt = set_state(n=60, seed=1)
    dense = GKADecoder(dim=3, dim_x=2, lengthscale=[0.4, 0.9], modulate=modulate)
    knn = GKADecoder(dim=3, dim_x=2, lengthscale=[0.4, 0.9], modulate=modulate, k=60)
    knn.load_state_dict(dense.state_dict())
    torch.testing.assert_close(knn([state], None, xt), dense([state], None, xt), atol=1e-5, rtol=1e-5)


def test_knn_gka_averages_the_k_nearest_in_the_scaled_metric():
    state, xt = set_state(n=80, seed=2)
    scale = torch.tensor([0.2, 1.5])  # anisotropic: the nearest in the scaled metric differ from the Euclidean
    decoder = GKADecoder(dim=3, dim_x=2, lengthscale=scale.tolist(), k=6)
    out = decoder([state], None, xt)
    dist = torch.cdist(xt / scale, state.x / scale).masked_fill(~state.mask[:, None], float("inf"))
    nearest = dist.topk(6, largest=False).indices  # [B, Nt, 6]
    for t in range(xt.shape[1]):
        only = torch.zeros_like(state.mask)
        only.scatter_(1, nearest[:, t], True)
        expected = gka_by_hand(xt[:, t : t + 1], state.x, state.tokens, state.mask & only, decoder.lengthscale)
        torch.testing.assert_close(out[:, t : t + 1], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("roll", [[False, False], [False, True]])
def test_gka_on_grid_states_dense_and_knn(roll):
    grid = Grid([-1.0, 0.0], [1.0, 360.0], [4, 6], roll)
    coords = torch.tensor(grid_coords(grid))
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randn(2, 4, 6, 5, generator=gen)
    xt = torch.stack([torch.rand(2, 7, generator=gen) * 2 - 1, torch.rand(2, 7, generator=gen) * 360], -1)
    dense = GKADecoder(grid=grid, dim=5, dim_x=2, lengthscale=[0.5, 40.0])
    out = dense([Latent(tokens, grid=grid)], None, xt)
    period = [0.0, 360.0] if roll[1] else None
    expected = gka_by_hand(
        xt, coords.expand(2, -1, -1), tokens.reshape(2, 24, 5), torch.ones(2, 24, dtype=torch.bool),
        dense.lengthscale, roll_period=period,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    knn = GKADecoder(grid=grid, dim=5, dim_x=2, lengthscale=[0.5, 40.0], k=16)  # the 4 x 4 block around a target
    local = knn([Latent(tokens, grid=grid)], None, xt)
    assert torch.isfinite(local).all() and not torch.allclose(local, out)


def test_gka_empty_context_gives_zeros_and_learns_its_lengthscales():
    state, xt = set_state()
    empty = Latent(state.tokens, mask=torch.zeros_like(state.mask), x=state.x)
    for k in (None, 5):
        decoder = GKADecoder(dim=3, dim_x=2, k=k)
        out = decoder([empty], None, xt)
        assert torch.equal(out, torch.zeros_like(out))
        decoder([state], None, xt).square().sum().backward()
        assert decoder.log_lengthscale.grad is not None and torch.isfinite(decoder.log_lengthscale.grad).all()
        assert decoder.log_lengthscale.grad.abs().sum() > 0


def test_gka_errors_are_actionable():
    with pytest.raises(ValueError, match="lengthscale must be one positive number or 2"):
        GKADecoder(dim_x=2, lengthscale=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        GKADecoder(dim_x=2, k=0)
    with pytest.raises(ValueError, match="layers must be 1"):
        GKADecoder(dim_x=2, layers=3)
    state, xt = set_state()
    with pytest.raises(ValueError, match="in_dim=1 but the tokens are 3 wide"):
        GKADecoder(dim=1, dim_x=2)([state], None, xt)
