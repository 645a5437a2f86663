"""HyperMixer processor against a naive reference: the token-mixing MLP built and applied with Python loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gridtnp.nn.grids import Grid
from gridtnp.nn.processors import HyperMixerProcessor
from gridtnp.nn.tokens import Latent
from gridtnp.registry import build_from_spec


def mlp_by_hand(net: torch.nn.Sequential, v: torch.Tensor) -> torch.Tensor:
    """``Linear -> GELU -> Linear`` on one vector, from the weights."""
    first, last = net[0], net[2]
    return last.weight @ F.gelu(first.weight @ v + first.bias) + last.bias


def hypermixer_by_hand(proc: HyperMixerProcessor, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every block token by token: generate rows of W1, W2 per valid token, mix, add the per-token MLP."""
    z = z.clone().double()
    proc = proc.double()
    b, n, d = z.shape
    for block in proc.blocks:
        out = z.clone()
        for bi in range(b):
            valid = [i for i in range(n) if mask[bi, i]]
            x = [F.layer_norm(z[bi, i], (d,), block.norm1.weight, block.norm1.bias) for i in range(n)]
            w1 = {i: mlp_by_hand(block.mixing.h1, x[i]) for i in valid}  # row i of W1: [P]
            w2 = {i: mlp_by_hand(block.mixing.h2, x[i]) for i in valid}
            p = next(iter(w1.values())).numel() if valid else 0
            hidden = torch.zeros(p, d, dtype=torch.float64)  # W1^T x / N, then GELU: [P, D]
            for i in valid:
                hidden += torch.outer(w1[i], x[i]) / len(valid)
            hidden = F.gelu(hidden)
            for i in range(n):
                mixed = w2[i] @ hidden if i in w2 else torch.zeros(d, dtype=torch.float64)
                y = z[bi, i] + mixed
                y = y + mlp_by_hand(block.mlp, F.layer_norm(y, (d,), block.norm2.weight, block.norm2.bias))
                out[bi, i] = y
        z = out
    return torch.where(mask.unsqueeze(-1), z, 0.0).float()


@pytest.mark.parametrize("tied", [False, True])
def test_hypermixer_matches_a_naive_loop(tied):
    torch.manual_seed(0)
    proc = HyperMixerProcessor(dim=8, layers=2, mixing_dim=5, hyper_hidden=6, mlp_dim=7, tied=tied)
    z = torch.randn(2, 9, 8)
    mask = torch.rand(2, 9) < 0.7
    mask[:, 0] = True
    states = proc(Latent(z, mask=mask, x=torch.randn(2, 9, 1)))
    assert len(states) == 2 and states[-1].mask is mask and states[-1].x is not None
    expected = hypermixer_by_hand(proc, z, mask)
    torch.testing.assert_close(states[-1].tokens, expected, atol=1e-5, rtol=1e-5)
    assert (proc.blocks[0].mixing.h1 is proc.blocks[0].mixing.h2) == tied


def test_hypermixer_ignores_padding_and_is_permutation_equivariant():
    torch.manual_seed(1)
    proc = HyperMixerProcessor(dim=8, layers=3, mixing_dim=4, hyper_hidden=8, mlp_dim=8)
    z, mask = torch.randn(2, 6, 8), torch.ones(2, 6, dtype=torch.bool)
    out = proc(Latent(z, mask=mask))[-1].tokens
    padded = proc(Latent(torch.cat([z, 100 * torch.randn(2, 4, 8)], 1), mask=torch.cat([mask, ~mask[:, :4]], 1)))
    torch.testing.assert_close(padded[-1].tokens[:, :6], out, atol=1e-5, rtol=1e-5)
    assert torch.equal(padded[-1].tokens[:, 6:], torch.zeros(2, 4, 8))
    perm = torch.randperm(6)
    shuffled = proc(Latent(z[:, perm], mask=mask))[-1].tokens
    torch.testing.assert_close(shuffled, out[:, perm], atol=1e-5, rtol=1e-5)


def test_hypermixer_on_grid_tokens_is_the_flattened_set():
    torch.manual_seed(2)
    grid = Grid([-1.0, -1.0], [1.0, 1.0], [4, 6])
    proc = build_from_spec("processor", {"name": "hypermixer", "layers": 2}, dim=16)
    tokens = torch.randn(3, 4, 6, 16)
    states = proc(Latent(tokens, grid=grid))
    assert states[-1].tokens.shape == tokens.shape and states[-1].grid is grid
    flat = proc(Latent(tokens.reshape(3, 24, 16), mask=torch.ones(3, 24, dtype=torch.bool)))
    torch.testing.assert_close(states[-1].tokens.reshape(3, 24, 16), flat[-1].tokens, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        HyperMixerProcessor(layers=0)
