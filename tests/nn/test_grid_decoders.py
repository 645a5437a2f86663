"""Grid decoders: k-NN cross-attention (gridded TNP), full cross-attention, local kernel interpolation.

References are independent of ``Grid.neighbours``: neighbourhoods come from a Python loop over coordinates,
and the k-NN decoder is compared with dense cross-attention blocks under that neighbourhood mask.
"""

from __future__ import annotations

import math

import pytest
import torch

from gridtnp.nn.attention import CrossAttentionBlock
from gridtnp.nn.grid_decoders import KernelInterpolationDecoder, KNNDecoder
from gridtnp.nn.grid_decoders.knn import NeighbourCrossAttentionBlock, embed_offsets
from gridtnp.nn.grids import Grid
from gridtnp.nn.tokens import Latent, Tokens
from gridtnp.registry import ConfigError, build_from_spec
from tests.conftest import grid_coords

DIM, HEADS, HEAD_DIM = 16, 4, 4


def offset_in_spacings(x: list[float], g: list[float], grid: Grid) -> list[float]:
    """``(x - g) / spacing`` per dimension, wrapping rolled dimensions by hand."""
    out = []
    for d in range(grid.ndim):
        diff = x[d] - g[d]
        period = grid.upper[d] - grid.lower[d]
        if grid.roll[d]:
            diff = (diff + period / 2) % period - period / 2
        out.append(diff / (period / (grid.shape[d] if grid.roll[d] else grid.shape[d] - 1)))
    return out


def neighbour_mask(xt: torch.Tensor, grid: Grid, k: int) -> torch.Tensor:
    """``[B, Nt, M]``: the grid points in the hypercube of ``s = ceil(k^(1/d))`` per dimension around each target
    (those within ``s / 2`` spacings along every dimension), cut to the ``k`` nearest; loops over everything."""
    s = math.ceil(round(k ** (1 / grid.ndim), 9))
    coords = grid_coords(grid)
    b, nt, _ = xt.shape
    mask = torch.zeros(b, nt, len(coords), dtype=torch.bool)
    for bi in range(b):
        for t in range(nt):
            x = xt[bi, t].tolist()
            cube = []
            for m, g in enumerate(coords):
                off = offset_in_spacings(x, g, grid)
                if all(abs(o) < s / 2 for o in off):
                    cube.append((sum(o * o for o in off), m))
            for _, m in sorted(cube)[:k]:
                mask[bi, t, m] = True
    return mask


def random_targets(b: int, nt: int, grid: Grid) -> torch.Tensor:
    """Targets over the grid's bounds: some hug corners, one is far outside and one just outside the ordinary dims."""
    lo, hi = torch.tensor(grid.lower), torch.tensor(grid.upper)
    xt = lo + (hi - lo) * torch.rand(b, nt, grid.ndim)
    step = torch.tensor(grid.spacing)
    xt[:, 0] = lo + 0.03 * step  # at the lower corner
    xt[:, 1] = hi - 0.04 * step  # at the upper corner (wraps on rolled dims)
    if not all(grid.roll):
        far = torch.tensor([hi[d] + 10 * step[d] if not r else lo[d] for d, r in enumerate(grid.roll)])
        xt[:, 2] = far  # no grid point within reach: zero attention update
        roll = torch.tensor(grid.roll)
        xt[:, 3] = torch.where(roll, xt[:, 3], lo - 0.7 * step)  # just outside: only part of its neighbourhood
    return xt


def grid_states(b: int, grid: Grid, n: int) -> list[Latent]:
    return [Latent(torch.randn(b, *grid.shape, DIM), grid=grid) for _ in range(n)]


def dense_reference(dec: KNNDecoder, states: list[Latent], zt: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dense cross-attention blocks with the decoder's weights and a ``[B, Nt, M]`` neighbourhood mask."""
    for block, state in zip(dec.blocks, states[len(states) - len(dec.blocks) :], strict=True):
        ref = CrossAttentionBlock(DIM, HEADS, HEAD_DIM, DIM)
        ref.load_state_dict(block.state_dict())  # strict: the k-NN block has exactly the dense block's parameters
        zt = ref(zt, state.flat()[0], mask)
    return zt


def loop_attend(
    block: torch.nn.Module, zq: torch.Tensor, tokens: torch.Tensor, offsets: list | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """One target's attention update ``[D]`` over ``tokens [K, D]``, written out head by head: the block's ``rel``
    embedding of ``offsets`` added to the keys (and values when it is twice as wide), ``bias [H, K]`` to the logits."""
    q = block.attn.to_q(block.norm_q(zq))
    keys, values = block.attn.to_kv(block.norm_kv(tokens)).chunk(2, -1)
    if block.rel is not None:
        rel = block.rel(torch.tensor(offsets))
        keys = keys + rel[:, : HEADS * HEAD_DIM]
        if rel.shape[-1] > HEADS * HEAD_DIM:
            values = values + rel[:, HEADS * HEAD_DIM :]
    heads = []
    for h in range(HEADS):
        s = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
        logits = keys[:, s] @ q[s] / math.sqrt(HEAD_DIM) + (0.0 if bias is None else bias[h])
        heads.append(torch.softmax(logits, 0) @ values[:, s])
    return block.attn.out(torch.cat(heads))


def knn(grid: Grid | None, k: int = 9, layers: int = 1, **kwargs) -> KNNDecoder:
    return KNNDecoder(grid, dim=DIM, k=k, layers=layers, heads=HEADS, head_dim=HEAD_DIM, mlp_dim=DIM, **kwargs)


GRIDS = {
    "1d": (Grid([0.0], [1.0], [7]), 3),
    "2d": (Grid([-1.0, 0.0], [1.0, 2.0], [6, 5]), 9),
    "2d_rolled": (Grid([-1.0, 0.0], [1.0, 6.0], [5, 6], roll=[False, True]), 9),
    "3d": (Grid([0.0, 0.0, -1.0], [1.0, 2.0, 1.0], [4, 3, 4], roll=[False, False, True]), 8),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_knn_equals_dense_cross_attention_with_neighbourhood_mask(name: str) -> None:
    grid, k = GRIDS[name]
    dec = knn(grid, k=k, layers=3)
    states = grid_states(2, grid, 4)  # the decoder reads the last 3 of 4 states
    xt, zt = random_targets(2, 12, grid), torch.randn(2, 12, DIM)
    mask = neighbour_mask(xt, grid, k)
    counts = mask.sum(-1)
    assert (counts == k).any() and ((counts > 0) & (counts < k)).any()  # interior and edge targets
    if not all(grid.roll):
        assert (counts[:, 2] == 0).all()
    out = dec(states, zt, xt)
    torch.testing.assert_close(out, dense_reference(dec, states, zt, mask), atol=1e-5, rtol=1e-5)


def test_knn_non_perfect_power_keeps_the_nearest_k() -> None:
    grid = Grid([0.0, 0.0], [1.0, 1.0], [6, 7])
    dec = knn(grid, k=5, layers=2)
    states = grid_states(3, grid, 2)
    xt, zt = random_targets(3, 10, grid), torch.randn(3, 10, DIM)
    mask = neighbour_mask(xt, grid, 5)
    # Away from the edges the 5 kept are the 5 nearest of the whole grid (brute force over every grid point).
    coords = torch.tensor(grid_coords(grid))
    dist = ((xt.unsqueeze(-2) - coords) / torch.tensor(grid.spacing)).square().sum(-1)
    nearest = torch.zeros_like(mask).scatter_(-1, dist.topk(5, largest=False).indices, True)
    interior = mask.sum(-1) == 5
    assert interior.sum() > 10 and (mask[interior] == nearest[interior]).all()
    out = dec(states, zt, xt)
    torch.testing.assert_close(out, dense_reference(dec, states, zt, mask), atol=1e-5, rtol=1e-5)


def test_knn_longitude_wraps() -> None:
    grid = Grid([-180.0, -90.0], [180.0, 90.0], [36, 19], roll=[True, False])
    xt = torch.tensor([[[179.9, 12.0], [-179.9, 12.0], [0.0, 12.0]]])
    mask = neighbour_mask(xt, grid, 9)
    lon = {m // 19 for m in mask[0, 0].nonzero().flatten().tolist()}
    assert lon == {35, 0, 1} and (mask[0, 0] == mask[0, 1]).all()
    dec = knn(grid, layers=2)
    states = grid_states(1, grid, 2)
    zt = torch.randn(1, 1, DIM).expand(1, 3, DIM)  # the same token at all three targets
    out = dec(states, zt, xt)
    torch.testing.assert_close(out[0, 0], out[0, 1])  # the same neighbours across the date line
    assert not torch.allclose(out[0, 0], out[0, 2], atol=1e-3)
    torch.testing.assert_close(out, dense_reference(dec, states, zt, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("relative_position", [False, True])
def test_knn_padding_and_target_independence(relative_position: bool) -> None:
    grid = GRIDS["2d_rolled"][0]
    dec = knn(grid, layers=2, relative_position=relative_position)
    states = grid_states(3, grid, 2)
    xt, zt = random_targets(3, 9, grid), torch.randn(3, 9, DIM)
    out = dec(states, zt, xt)
    # Padded targets (arbitrary x and z) appended: the real targets' outputs do not move.
    pad_x, pad_z = torch.randn(3, 5, 2) * 50, torch.randn(3, 5, DIM)
    padded = dec(states, torch.cat([zt, pad_z], 1), torch.cat([xt, pad_x], 1))
    torch.testing.assert_close(padded[:, :9], out, atol=1e-6, rtol=1e-6)
    # Permuting targets permutes outputs; changing one target leaves the others unchanged.
    perm = torch.randperm(9)
    torch.testing.assert_close(dec(states, zt[:, perm], xt[:, perm]), out[:, perm], atol=1e-6, rtol=1e-6)
    xt2, zt2 = xt.clone(), zt.clone()
    xt2[:, 4], zt2[:, 4] = xt[:, 5], torch.randn(3, DIM)
    out2 = dec(states, zt2, xt2)
    keep = [i for i in range(9) if i != 4]
    torch.testing.assert_close(out2[:, keep], out[:, keep], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out2[:, 4], out[:, 4])
    # Batch items are independent too.
    one = dec([Latent(s.tokens[1:2], grid=grid) for s in states], zt[1:2], xt[1:2])
    torch.testing.assert_close(one, out[1:2], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", [True, "keys_values"])
def test_knn_relative_position_matches_loop(mode: bool | str) -> None:
    grid = GRIDS["2d_rolled"][0]
    dec = knn(grid, k=9, relative_position=mode)
    assert dec.blocks[0].rel is not None
    (state,) = grid_states(2, grid, 1)
    xt, zt = random_targets(2, 6, grid), torch.randn(2, 6, DIM)
    out = dec([state], zt, xt)
    block, coords = dec.blocks[0], grid_coords(grid)
    mask = neighbour_mask(xt, grid, 9)
    ref = torch.zeros(2, 6, DIM)
    for b in range(2):  # explicit loop: per target, its own neighbours, offsets and softmax
        for t in range(6):
            nbrs = mask[b, t].nonzero().flatten().tolist()
            if not nbrs:
                continue
            offs = [offset_in_spacings(xt[b, t].tolist(), coords[m], grid) for m in nbrs]
            ref[b, t] = loop_attend(block, zt[b, t], state.flat()[0][b, nbrs], offs, None)
    ref = zt + ref
    ref = ref + block.mlp(block.norm2(ref))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_knn_uses_the_grid_carried_by_the_state() -> None:
    fine = Grid([0.0, 0.0], [1.0, 1.0], [8, 8])
    coarse = Grid([0.0, 0.0], [1.0, 1.0], [4, 4])  # e.g. a ViT with 2 x 2 patches
    states = grid_states(2, coarse, 2)
    xt, zt = random_targets(2, 10, coarse), torch.randn(2, 10, DIM)
    mask = neighbour_mask(xt, coarse, 9)
    for grid in (fine, None):
        dec = knn(grid, layers=2)
        torch.testing.assert_close(dec(states, zt, xt), dense_reference(dec, states, zt, mask), atol=1e-5, rtol=1e-5)
    # A state without a grid (e.g. a CNN processor) falls back to the decoder's grid.
    dec = knn(coarse, layers=2)
    plain = [Latent(s.tokens) for s in states]
    torch.testing.assert_close(dec(plain, zt, xt), dense_reference(dec, states, zt, mask), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="grid tokens"):
        knn(None)(plain, zt, xt)
    with pytest.raises(ValueError, match="grid tokens"):
        knn(fine)(plain, zt, xt)  # tokens are 4 x 4 but the decoder's grid is 8 x 8
    with pytest.raises(ValueError, match="grid tokens"):
        knn(fine)([Latent(torch.randn(2, 5, DIM), mask=torch.ones(2, 5, dtype=torch.bool))], zt, xt)


def test_knn_build_and_errors() -> None:
    grid = Grid([0.0, 0.0], [1.0, 1.0], [3, 3])
    dec = build_from_spec(
        "grid_decoder", {"name": "knn", "k": 4, "relative_position": True}, dim=DIM, dim_x=2, grid=grid, layers=3
    )
    assert len(dec.blocks) == 3 and dec.k == 4
    with pytest.raises(ValueError, match="k"):
        knn(grid, k=0)
    with pytest.raises(ValueError, match="relative_position"):
        knn(None, relative_position=True)
    with pytest.raises(ValueError, match="4 points per dimension"):
        knn(grid, k=16)(grid_states(1, grid, 1), torch.randn(1, 2, DIM), torch.rand(1, 2, 2))
    with pytest.raises(ValueError, match="input dimension"):
        knn(grid)(grid_states(1, grid, 1), torch.randn(1, 2, DIM), torch.rand(1, 2, 3))
    with pytest.raises(ValueError, match="processor produced 1"):
        knn(grid, layers=2)(grid_states(1, grid, 1), torch.randn(1, 2, DIM), torch.rand(1, 2, 2))
    with pytest.raises(ConfigError, match="did you mean 'k'"):
        build_from_spec("grid_decoder", {"name": "knn", "kk": 4}, dim=DIM, grid=grid)


def test_full_cross_attention_decoder_on_grid_latents() -> None:
    """The paper's "full" decoder: every target attends to every grid token (an all-True neighbourhood)."""
    grid = GRIDS["2d"][0]
    dec = build_from_spec(
        "grid_decoder",
        {"name": "cross_attention", "heads": HEADS, "head_dim": HEAD_DIM, "mlp_dim": DIM},
        dim=DIM,
        grid=grid,
        layers=2,
    )
    states = grid_states(2, grid, 3)
    xt, zt = random_targets(2, 5, grid), torch.randn(2, 5, DIM)
    full = torch.ones(2, 5, grid.num_points, dtype=torch.bool)
    torch.testing.assert_close(dec(states, zt, xt), dense_reference(dec, states, zt, full), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["1d", "2d_rolled", "3d"])
def test_kernel_interpolation_nearest_equals_truncated_dense(name: str) -> None:
    grid = GRIDS[name][0]
    ls = [0.3 * s for s in (2.0, 1.5, 2.5)[: grid.ndim]]
    local = KernelInterpolationDecoder(
        grid, dim=DIM, lengthscale=[s * g for s, g in zip(ls, grid.spacing, strict=True)], nearest=3
    )
    chunked = KernelInterpolationDecoder(grid, dim=DIM, nearest=3, chunk_size=4)
    chunked.load_state_dict(local.state_dict())
    u = torch.randn(2, *grid.shape, DIM)
    xt = random_targets(2, 11, grid)
    out = local([Latent(u, grid=grid)], None, xt)
    # Dense reference by hand: the SE kernel to every grid point, zeroed outside the 3^d neighbourhood.
    coords, lengthscale = grid_coords(grid), local.lengthscale.tolist()
    spacing, mask = grid.spacing, neighbour_mask(xt, grid, 3**grid.ndim)
    weights = torch.zeros(2, 11, len(coords))
    for b in range(2):
        for t in range(11):
            for m, g in enumerate(coords):
                off = offset_in_spacings(xt[b, t].tolist(), g, grid)
                weights[b, t, m] = math.exp(
                    -0.5 * sum((o * s / lv) ** 2 for o, s, lv in zip(off, spacing, lengthscale, strict=True))
                )
    ref = local.proj((weights * mask) @ u.reshape(2, -1, DIM))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked([Latent(u, grid=grid)], None, xt), out)
    # The truncation matters: the dense decoder (all grid points) differs.
    dense = KernelInterpolationDecoder(grid, dim=DIM)
    dense.load_state_dict(local.state_dict())
    assert not torch.allclose(dense([Latent(u, grid=grid)], None, xt), out, atol=1e-4)


def test_kernel_interpolation_nearest_uses_state_grid_and_validates() -> None:
    fine, coarse = Grid([0.0], [1.0], [9]), Grid([0.0], [1.0], [5])
    dec = KernelInterpolationDecoder(fine, dim=DIM, lengthscale=0.2, nearest=3)
    ref = KernelInterpolationDecoder(coarse, dim=DIM, lengthscale=0.2, nearest=3)
    ref.load_state_dict(dec.state_dict())
    u, xt = torch.randn(2, 5, DIM), torch.rand(2, 7, 1)
    torch.testing.assert_close(dec([Latent(u, grid=coarse)], None, xt), ref([Latent(u)], None, xt))
    with pytest.raises(ValueError, match="nearest"):
        KernelInterpolationDecoder(fine, nearest=0)
    with pytest.raises(ValueError, match="grid tokens"):
        dec([Latent(u)], None, xt)  # 5 tokens without a grid: the decoder's grid has 9


def test_knn_context_skip_matches_loop() -> None:
    """context_k: each target attends in one softmax to its grid neighbours and its nearest context tokens of the
    chosen sources (brute-force nearest here), with offsets in grid spacings on both."""
    grid = GRIDS["2d"][0]
    dec = knn(grid, k=4, relative_position="keys_values", context_k=3, context_sources=["stations"])
    (state,) = grid_states(2, grid, 1)
    xt, zt = random_targets(2, 5, grid), torch.randn(2, 5, DIM)
    xc = torch.rand(2, 7, 2) * 2 - 1
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False  # padding is never a neighbour
    stations = Tokens(xc, torch.randn(2, 7, DIM), mask)
    other = Tokens(torch.zeros(2, 1, 2), torch.randn(2, 1, DIM), torch.ones(2, 1, dtype=torch.bool))  # not read
    out = dec([state], zt, xt, context={"grid": other, "stations": stations})
    block, coords, step = dec.blocks[0], grid_coords(grid), torch.tensor(grid.spacing)
    near_grid = neighbour_mask(xt, grid, 4)
    ref = torch.zeros(2, 5, DIM)
    for b in range(2):  # explicit loop over tasks and targets
        for t in range(5):
            g = near_grid[b, t].nonzero().flatten().tolist()
            dist = [float((xt[b, t] - xc[b, i]).norm()) if mask[b, i] else math.inf for i in range(7)]
            c = sorted(range(7), key=dist.__getitem__)[:3]
            tokens = torch.cat([state.tokens[b].reshape(-1, DIM)[g], stations.z[b, c]])
            offs = [offset_in_spacings(xt[b, t].tolist(), coords[m], grid) for m in g]
            offs += [((xt[b, t] - xc[b, i]) / step).tolist() for i in c]
            ref[b, t] = loop_attend(block, zt[b, t], tokens, offs, None)
    ref = zt + ref
    ref = ref + block.mlp(block.norm2(ref))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="context_sources"):
        dec([state], zt, xt, context={"grid": other})
    with pytest.raises(ValueError, match="context_k must be an integer >= 0"):
        knn(grid, context_k=-1)


def test_knn_distance_bias_matches_loop() -> None:
    """distance_bias: each head's logits get -softplus(a_h) |offset|^2 (offsets in grid spacings) before the softmax."""
    grid = GRIDS["2d"][0]
    dec = knn(grid, k=4, distance_bias=True)
    block = dec.blocks[0]
    with torch.no_grad():
        block.decay.copy_(torch.tensor([-2.0, 0.0, 1.0, 3.0]))
    (state,) = grid_states(2, grid, 1)
    xt, zt = random_targets(2, 5, grid), torch.randn(2, 5, DIM)
    out = dec([state], zt, xt)
    coords = grid_coords(grid)
    near = neighbour_mask(xt, grid, 4)
    ref = torch.zeros(2, 5, DIM)
    for b in range(2):
        for t in range(5):
            g = near[b, t].nonzero().flatten().tolist()
            if not g:
                continue
            sq = torch.tensor([sum(o * o for o in offset_in_spacings(xt[b, t].tolist(), coords[m], grid)) for m in g])
            bias = -torch.nn.functional.softplus(block.decay)[:, None] * sq  # [H, K]
            ref[b, t] = loop_attend(block, zt[b, t], state.tokens[b].reshape(-1, DIM)[g], None, bias)
    ref = zt + ref
    ref = ref + block.mlp(block.norm2(ref))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_offsets_shared_by_every_task_are_embedded_once_with_the_same_values_and_gradients():
    torch.manual_seed(0)
    block = NeighbourCrossAttentionBlock(dim=32, heads=2, head_dim=8, mlp_dim=16, rel_dim=2, rel_values=True)
    one_task = torch.randn(1, 7, 4, 2)
    for offset in (one_task.expand(3, -1, -1, -1).contiguous(), torch.randn(3, 7, 4, 2)):
        shared = embed_offsets(block.rel, offset)
        grads = torch.autograd.grad(shared.square().sum(), list(block.rel.parameters()))
        direct = block.rel(offset)
        torch.testing.assert_close(shared, direct)
        for g, h in zip(grads, torch.autograd.grad(direct.square().sum(), list(block.rel.parameters())), strict=True):
            torch.testing.assert_close(g, h)
