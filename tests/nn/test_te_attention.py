"""Translation-equivariant attention: chunked = unchunked (values and gradients), translation and rotation symmetry,
and the TE k-NN grid decoder's equivariance when the grid and the targets move together."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gridtnp.nn.attention import SelfAttentionBlock
from gridtnp.nn.chunking import map_query_chunks
from gridtnp.nn.grid_decoders import TEKNNDecoder
from gridtnp.nn.grids import Grid
from gridtnp.nn.te_attention import TEAttention
from gridtnp.nn.tokens import Latent

DIM, HEADS, HEAD_DIM = 16, 4, 4


def inputs(b: int = 2, nq: int = 9, nk: int = 11, dx: int = 2) -> tuple[torch.Tensor, ...]:
    """Random queries/keys with gradients and a key mask with one task that has no valid key."""
    zq, zk = torch.randn(b, nq, DIM), torch.randn(b, nk, DIM)
    xq, xk = torch.randn(b, nq, dx), torch.randn(b, nk, dx)
    mask = torch.rand(b, nk) > 0.3
    mask[0, 0] = True
    mask[-1] = False  # an empty context: zero output, finite gradients
    return zq, zk, xq, xk, mask


def rotation(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])


@pytest.mark.parametrize(
    ("variant", "rotation_invariant", "update_locations"),
    [("post", False, False), ("pre", False, False), ("post", True, True), ("pre", False, True)],
)
def test_chunked_equals_unchunked_values_and_gradients(variant, rotation_invariant, update_locations):
    """Chunks of 7 (batch, query, key) triples (1 query row per chunk, under checkpoint) vs no chunking."""
    naive = TEAttention(
        DIM, 2, HEADS, HEAD_DIM, variant, rotation_invariant, update_locations=update_locations, max_pairs=None
    )
    chunked = copy.deepcopy(naive)
    chunked.max_pairs = 7
    results, data = [], inputs()
    for module in (naive, chunked):
        tensors = [t.clone().requires_grad_(t.is_floating_point()) for t in data]
        out, dx = module(*tensors)
        loss = out.square().sum() + (dx.square().sum() if dx is not None else 0.0)
        grads = torch.autograd.grad(loss, [*tensors[:4], *module.parameters()])
        results.append((out, dx, grads))
    (out_a, dx_a, grads_a), (out_b, dx_b, grads_b) = results
    torch.testing.assert_close(out_b, out_a, atol=1e-6, rtol=1e-5)
    if update_locations:
        torch.testing.assert_close(dx_b, dx_a, atol=1e-6, rtol=1e-5)
    assert out_a[-1].abs().max() == 0  # the task without keys
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.isfinite(ga).all()
        torch.testing.assert_close(gb, ga, atol=1e-6, rtol=1e-5)


def test_chunks_cover_every_query_once():
    seen = map_query_chunks(lambda s, e: list(range(s, e)), num_queries=10, num_keys=3, max_pairs=7)
    assert seen == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert map_query_chunks(lambda s, e: (s, e), 10, 3, None) == [(0, 10)]
    assert len(map_query_chunks(lambda s, e: (s, e), 4, 100, 7)) == 4  # at least one row per chunk
    with pytest.raises(ValueError, match="max_pairs must be >= 1"):
        map_query_chunks(lambda s, e: None, 4, 4, 0)


@pytest.mark.parametrize("variant", ["post", "pre"])
def test_attention_is_translation_invariant(variant):
    """Shifting every location by one vector leaves outputs and location updates unchanged (tolerance 1e-5)."""
    attn = TEAttention(DIM, 2, HEADS, HEAD_DIM, variant, update_locations=True, max_pairs=13)
    zq, zk, xq, xk, mask = inputs()
    shift = torch.tensor([3.5, -7.25])
    out, dx = attn(zq, zk, xq, xk, mask)
    out_s, dx_s = attn(zq, zk, xq + shift, xk + shift, mask)
    torch.testing.assert_close(out_s, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx_s, dx, atol=1e-5, rtol=1e-5)


def test_rotation_variant_is_rotation_invariant_and_updates_rotate():
    attn = TEAttention(DIM, 2, HEADS, HEAD_DIM, "post", rotation=True, update_locations=True)
    zq, zk, xq, xk, mask = inputs()
    r = rotation(0.7)
    out, dx = attn(zq, zk, xq, xk, mask)
    out_r, dx_r = attn(zq, zk, xq @ r.T, xk @ r.T, mask)
    torch.testing.assert_close(out_r, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx_r, dx @ r.T, atol=1e-5, rtol=1e-5)  # eq. 10 is rotation equivariant
    # The ordinary variant does see the rotation.
    plain = TEAttention(DIM, 2, HEADS, HEAD_DIM, "post")
    assert not torch.allclose(plain(zq, zk, xq @ r.T, xk @ r.T, mask)[0], plain(zq, zk, xq, xk, mask)[0], atol=1e-4)


def test_self_attention_block_padding_and_location_updates():
    """Padded keys change nothing; with update_locations the locations move, equivariantly."""
    block = SelfAttentionBlock(
        DIM, mlp_dim=32, attention=TEAttention(DIM, 2, HEADS, HEAD_DIM, update_locations=True, max_pairs=16)
    )
    z, x = torch.randn(2, 6, DIM), torch.randn(2, 6, 2)
    mask = torch.ones(2, 6, dtype=torch.bool)
    z2, x2 = block(z, mask, x)
    pad_z, pad_x = torch.cat([z, 9 * torch.randn(2, 3, DIM)], 1), torch.cat([x, 40 * torch.randn(2, 3, 2)], 1)
    pad_mask = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)
    z3, x3 = block(pad_z, pad_mask, pad_x)
    torch.testing.assert_close(z3[:, :6], z2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x3[:, :6], x2, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(x2, x)
    z4, x4 = block(z, mask, x + 5.0)
    torch.testing.assert_close(z4, z2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x4, x2 + 5.0, atol=1e-5, rtol=1e-5)


def test_invalid_options_are_reported():
    with pytest.raises(ValueError, match=r"variant must be one of \('post', 'pre'\)"):
        TEAttention(DIM, 2, variant="middle")
    with pytest.raises(ValueError, match="max_pairs must be >= 1"):
        TEAttention(DIM, 2, max_pairs=0)


def test_te_knn_decoder_is_equivariant_to_moving_grid_and_targets():
    """Moving the grid and the targets by the same vector leaves the decoded tokens unchanged: attention depends on
    target-to-grid offsets only. An ordinary k-NN decoder with the same tokens does the same, so the check that
    matters is that the offsets enter at all: moving the targets alone changes the output."""
    grid = Grid([-1.0, -2.0], [1.0, 2.0], [5, 6])
    shift = torch.tensor([0.37, -1.3])
    moved = Grid([-1.0 + 0.37, -2.0 - 1.3], [1.0 + 0.37, 2.0 - 1.3], [5, 6])
    decoder = TEKNNDecoder(grid, DIM, k=4, layers=2, heads=HEADS, head_dim=HEAD_DIM, mlp_dim=32, dim_x=2)
    tokens = torch.randn(2, 5, 6, DIM)
    states = [Latent(tokens), Latent(tokens * 0.5)]
    zt, xt = torch.randn(2, 7, DIM), 0.9 * torch.rand(2, 7, 2) * torch.tensor([2.0, 4.0]) + torch.tensor([-0.9, -1.8])
    out = decoder(states, zt, xt)
    out_moved = decoder([Latent(t.tokens, grid=moved) for t in states], zt, xt + shift)
    torch.testing.assert_close(out_moved, out, atol=1e-5, rtol=1e-5)
    nudged = decoder(states, zt, xt + 0.05)  # same neighbours, different offsets
    assert not torch.allclose(nudged, out, atol=1e-4)


def test_cpu_chunks_release_freed_memory_periodically(monkeypatch):
    """Every RELEASE_EVERY-th chunk on the CPU hands freed heap pages back (glibc keeps them resident otherwise)."""
    from gridtnp.nn import chunking

    calls = []
    monkeypatch.setattr(chunking, "release_cpu_memory", lambda: calls.append(1))
    n = 3 * chunking.RELEASE_EVERY + 1
    map_query_chunks(lambda s, e: s, num_queries=n, num_keys=1, max_pairs=1, cpu=True)
    assert len(calls) == 3
    map_query_chunks(lambda s, e: s, num_queries=n, num_keys=1, max_pairs=1, cpu=False)
    assert len(calls) == 3


def paper_te_attention(attn: TEAttention, zq, zk, xq, xk, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """TE-TNP eqs. 7, 8 and 10 written from the paper, one (task, query, key) at a time, with ``attn``'s weights.

    Eq. 7 (post): ``logit_hnm = rho_h(q_hn . k_hm / sqrt(Dh) over h, x_n - x_m)``; (pre): ``q_hn . k_hm / sqrt(Dh)
    + rho_h(x_n - x_m)``. Eq. 8: ``z_n = W_O cat_h sum_m alpha_hnm v_hm`` with ``alpha_hn = softmax_m(logit_hn)``
    over valid keys. Eq. 10: ``dx_n = (1 / N) sum_m (x_n - x_m) phi(alpha_nm)``, ``alpha_nm`` the vector over heads.
    """
    b, nq, _ = zq.shape
    nk = zk.shape[1]
    h, dh = attn.heads, attn.head_dim
    outs, dxs = torch.zeros(b, nq, zq.shape[-1]), torch.zeros(b, nq, xq.shape[-1])
    for i in range(b):
        q = attn.to_q(zq[i]).view(nq, h, dh)
        k, v = (t.view(nk, h, dh) for t in attn.to_kv(zk[i]).chunk(2, -1))
        keys = [m for m in range(nk) if mask[i, m]]
        if not keys:
            continue
        for n in range(nq):
            logits = []
            for m in keys:
                dots = torch.stack([q[n, j] @ k[m, j] for j in range(h)]) / math.sqrt(dh)
                rel = xq[i, n] - xk[i, m]
                if attn.variant == "post":
                    logits.append(attn.rho(torch.cat([dots, rel])))
                else:
                    logits.append(dots + attn.rho(rel))
            alpha = torch.softmax(torch.stack(logits), dim=0)  # [N, H], softmax over keys per head
            heads = torch.stack([sum(alpha[j, hh] * v[m, hh] for j, m in enumerate(keys)) for hh in range(h)])
            outs[i, n] = attn.out(heads.flatten())
            moves = [(xq[i, n] - xk[i, m]) * attn.phi(alpha[j]) for j, m in enumerate(keys)]
            dxs[i, n] = sum(moves) / len(keys)
    return outs, dxs


@pytest.mark.parametrize("variant", ["post", "pre"])
def test_te_attention_matches_the_papers_equations(variant):
    """Output (eqs. 7-8) and location update (eq. 10, phi of the softmax weights) equal the paper's loop."""
    torch.manual_seed(3)
    attn = TEAttention(DIM, 2, HEADS, HEAD_DIM, variant, update_locations=True, max_pairs=None)
    zq, zk, xq, xk, mask = inputs(nq=5, nk=6)
    with torch.no_grad():
        out, dx = attn(zq, zk, xq, xk, mask)
        want_out, want_dx = paper_te_attention(attn, zq, zk, xq, xk, mask)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dx, want_dx, atol=1e-5, rtol=1e-4)


def test_location_update_ignores_a_constant_added_to_every_logit():
    """Eq. 10 depends on the logits through the softmax weights only: shifting rho's output bias by a constant
    changes neither the attention output nor the location update."""
    torch.manual_seed(4)
    attn = TEAttention(DIM, 2, HEADS, HEAD_DIM, "post", update_locations=True)
    shifted = copy.deepcopy(attn)
    with torch.no_grad():
        shifted.rho[-1].bias += 3.0
    zq, zk, xq, xk, mask = inputs()
    with torch.no_grad():
        out, dx = attn(zq, zk, xq, xk, mask)
        out_s, dx_s = shifted(zq, zk, xq, xk, mask)
    torch.testing.assert_close(out_s, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx_s, dx, atol=1e-5, rtol=1e-5)
