"""Swin and ViT grid processors against independent references (full MHSA, explicit windows, brute-force rules)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from gridtnp.nn.attention import SelfAttentionBlock
from gridtnp.nn.grids import Grid
from gridtnp.nn.processors import SwinProcessor, TEPerceiverProcessor, ViTProcessor
from gridtnp.nn.tokens import Latent
from gridtnp.registry import build_from_spec

SMALL = {"dim": 16, "heads": 2, "head_dim": 8, "mlp_dim": 16}


def make_grid(shape: tuple[int, ...], roll: tuple[bool, ...] | None = None) -> Grid:
    return Grid([-1.0] * len(shape), [1.0] * len(shape), shape, roll)


def latent(grid: Grid, b: int = 2, dim: int = 16) -> Latent:
    return Latent(torch.randn(b, *grid.shape, dim), grid=grid)


def block_params(dim: int = 16, heads: int = 2, head_dim: int = 8, mlp_dim: int = 16) -> int:
    return sum(p.numel() for p in SelfAttentionBlock(dim, heads, head_dim, mlp_dim).parameters())


def make_identity(block: SelfAttentionBlock) -> None:
    """Zero the residual branches' output layers, so the pre-norm block is the identity."""
    with torch.no_grad():
        for layer in (block.attn.out, block.mlp[-1]):
            layer.weight.zero_()
            layer.bias.zero_()


# --- swin -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8,), (4, 6)])
def test_swin_with_one_window_and_no_shift_is_full_mhsa(shape):
    grid = make_grid(shape)
    proc = SwinProcessor(grid, layers=2, window=list(shape), shift=0, share_weights=False, **SMALL)
    reference = [SelfAttentionBlock(**SMALL) for _ in range(4)]
    for ref, block in zip(reference, proc.blocks, strict=True):
        ref.load_state_dict(block.state_dict())
    lat = latent(grid)
    states = proc(lat)
    assert len(states) == proc.num_states == 2
    z = lat.tokens.reshape(2, -1, 16)
    for layer, state in enumerate(states):
        z = reference[2 * layer + 1](reference[2 * layer](z))
        assert state.grid is grid and state.tokens.shape == lat.tokens.shape
        torch.testing.assert_close(state.tokens, z.reshape(lat.tokens.shape), atol=1e-5, rtol=1e-5)


def test_swin_regular_windows_match_explicit_slices():
    """The first block of a layer equals MHSA applied to each explicitly sliced window."""
    grid = make_grid((8, 12))
    proc = SwinProcessor(grid, layers=1, window=[4, 3], share_weights=False, **SMALL)
    make_identity(proc.blocks[1])  # keep only the regular-window block
    lat = latent(grid)
    out = proc(lat)[0].tokens
    expected = torch.empty_like(out)
    for i, j in itertools.product(range(0, 8, 4), range(0, 12, 3)):  # reference loop over windows
        win = lat.tokens[:, i : i + 4, j : j + 3]
        expected[:, i : i + 4, j : j + 3] = proc.blocks[0](win.reshape(2, -1, 16)).reshape(win.shape)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def shifted_reference(shape, window, shift, roll) -> torch.Tensor:
    """``[M, M]``: may token j influence token i in one shifted-window block? Brute force over coordinates.

    The shifted windows along a dimension are the index intervals ``[shift + k w, shift + (k + 1) w)``; along an
    ordinary dimension they are cut at the grid border (so ``[0, shift)`` is its own window), along a rolled one
    they wrap modulo the size. Two tokens interact iff they share the interval along every dimension.
    """
    points = list(itertools.product(*(range(m) for m in shape)))

    def label(idx):
        labels = []
        for i, m, w, s, r in zip(idx, shape, window, shift, roll, strict=True):
            labels.append(((i - s) % m) // w if r else (i - s) // w)  # floor division: i < s gives -1
        return tuple(labels)

    labels = [label(p) for p in points]
    return torch.tensor([[a == b for b in labels] for a in labels])


def influence(proc: SwinProcessor, grid: Grid) -> torch.Tensor:
    """``[M, M]``: does perturbing token j change output token i? One batch item per perturbed token."""
    m = grid.num_points
    base = torch.randn(1, m, 16)
    z = base.repeat(m + 1, 1, 1)
    # Item 1 + j perturbs token j in a random direction (a constant shift would vanish in the LayerNorm).
    z[1:] += torch.eye(m)[:, :, None] * 3.0 * torch.randn(16)
    out = proc(Latent(z.reshape(m + 1, *grid.shape, 16), grid=grid))[0].tokens.reshape(m + 1, m, 16)
    changed = (out[1:] - out[:1]).abs().amax(-1) > 0  # [perturbed j, output i]
    return changed.T


@pytest.mark.parametrize(
    "shape, window, shift, roll",
    [
        ((8, 12), (4, 4), (2, 2), (False, False)),
        ((8, 12), (4, 4), (2, 1), (False, True)),
        ((8, 12), (4, 6), (3, 2), (True, True)),
        ((12,), (4,), (2,), (False,)),
        ((4, 4, 8), (2, 2, 4), (1, 1, 2), (False, False, True)),
    ],
)
def test_shifted_windows_mix_only_neighbours(shape, window, shift, roll):
    grid = make_grid(shape, roll)
    proc = SwinProcessor(grid, layers=1, window=list(window), shift=list(shift), share_weights=False, **SMALL)
    make_identity(proc.blocks[0])  # keep only the shifted-window block
    assert torch.equal(influence(proc, grid), shifted_reference(shape, window, shift, roll))


def test_rolled_dimension_wraps_and_ordinary_does_not():
    for rolled in (False, True):
        grid = make_grid((4, 8), (False, rolled))
        proc = SwinProcessor(grid, layers=1, window=4, share_weights=False, **SMALL)
        make_identity(proc.blocks[0])
        z = torch.randn(1, 4, 8, 16)
        z2 = z.clone()
        z2[0, 1, 0] += 3.0 * torch.randn(16)  # column 0 ...
        out, out2 = (proc(Latent(t, grid=grid))[0].tokens for t in (z, z2))
        assert (out2[0, 1, -1] != out[0, 1, -1]).any() == rolled  # ... reaches column M - 1 only when rolled
    grid = make_grid((4, 8), (False, True))  # roll_dims overrides the grid's roll
    proc = SwinProcessor(grid, layers=1, window=4, roll_dims=[False, False], share_weights=False, **SMALL)
    make_identity(proc.blocks[0])
    assert torch.equal(influence(proc, grid), shifted_reference((4, 8), (4, 4), (0, 2), (False, False)))


def test_swin_is_equivariant_to_window_multiple_rolls_along_rolled_dims():
    grid = make_grid((8, 12), (True, True))
    proc = SwinProcessor(grid, layers=2, window=[4, 3], **SMALL)
    z = torch.randn(2, 8, 12, 16)
    out = proc(Latent(z, grid=grid))[-1].tokens
    rolled = proc(Latent(z.roll((4, 6), (1, 2)), grid=grid))[-1].tokens
    torch.testing.assert_close(rolled, out.roll((4, 6), (1, 2)), atol=1e-5, rtol=1e-5)
    off = proc(Latent(z.roll(1, 2), grid=grid))[-1].tokens  # not a window multiple: windows change
    assert not torch.allclose(off, out.roll(1, 2), atol=1e-4)


def test_swin_3d_keeps_shape_and_gradients_flow():
    grid = Grid([0.0, -90.0, 0.0], [1.0, 90.0, 360.0], (4, 8, 8), roll=(False, False, True))
    proc = build_from_spec("processor", {"name": "swin", "window": [2, 4, 4], "layers": 2}, grid=grid, **SMALL)
    lat = Latent(torch.randn(2, 4, 8, 8, 16, requires_grad=True), grid=grid)
    states = proc(lat)
    assert len(states) == proc.num_states == 2
    assert all(s.tokens.shape == (2, 4, 8, 8, 16) and s.grid is grid for s in states)
    states[-1].tokens.sum().backward()
    assert torch.isfinite(lat.tokens.grad).all()


def test_swin_errors_are_actionable():
    with pytest.raises(ValueError, match=r"dimension 1 has 30 points.*window 4.*multiples of 4 \(e\.g\. 28 or 32\)"):
        SwinProcessor(make_grid((8, 30)), **SMALL)
    with pytest.raises(ValueError, match=r"window must be one int or 2 ints"):
        SwinProcessor(make_grid((8, 8)), window=[4, 4, 4], **SMALL)
    with pytest.raises(ValueError, match=r"shift along dimension 0 must be in \[0, window\)"):
        SwinProcessor(make_grid((8, 8)), shift=4, **SMALL)
    with pytest.raises(ValueError, match=r"roll_dims must have one bool per grid dimension"):
        SwinProcessor(make_grid((8, 8)), roll_dims=[True], **SMALL)
    proc = SwinProcessor(make_grid((8, 8)), layers=1, **SMALL)
    with pytest.raises(ValueError, match=r"dimension 0 has 6 points"):
        proc(Latent(torch.randn(1, 6, 8, 16)))
    with pytest.raises(ValueError, match=r"needs grid tokens"):
        proc(Latent(torch.randn(1, 64, 16), mask=torch.ones(1, 64, dtype=torch.bool)))


def test_swin_masks_are_built_once_and_cached():
    grid = make_grid((8, 8))
    proc = SwinProcessor(grid, layers=2, **SMALL)
    proc(latent(grid))
    (key, plan), *rest = proc._plans.items()
    assert not rest and plan.shift == (2, 2) and plan.mask.shape == (4, 16, 16)
    proc(latent(grid, b=3))
    assert len(proc._plans) == 1 and proc._plans[key] is plan
    assert proc.plan((8, 8), torch.device("cpu")).mask is plan.mask
    assert not any("plan" in name for name in proc.state_dict())
    rolled = SwinProcessor(make_grid((8, 8), (True, True)), layers=1, **SMALL)
    assert rolled.plan((8, 8), torch.device("cpu")).mask is None  # wrapping needs no mask


def test_swin_parameter_count():
    proc = SwinProcessor(make_grid((32, 32)))  # paper defaults: dim 128, 5 layers, window 4, shift 2
    # One block per layer, applied to the regular then the shifted windows (as in the paper's code).
    assert sum(p.numel() for p in proc.parameters()) == 5 * block_params(128, 8, 16, 128) == 496_000
    unshared = SwinProcessor(make_grid((32, 32)), share_weights=False)
    assert sum(p.numel() for p in unshared.parameters()) == 10 * block_params(128, 8, 16, 128) == 992_000


# --- vit --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("roll", [(False, False), (False, True)])
def test_vit_patches_give_coarse_grid_of_patch_centres(roll):
    grid = Grid([-2.0, 0.0], [2.0, 360.0], (32, 32), roll)
    proc = ViTProcessor(grid, layers=2, patch=2, **SMALL)
    states = proc(latent(grid))
    assert len(states) == proc.num_states == 2
    coarse = states[-1].grid
    assert states[-1].tokens.shape == (2, 16, 16, 16) and coarse.shape == (16, 16) and coarse.roll == roll
    centres = F.avg_pool2d(grid.points().permute(2, 0, 1), 2).permute(1, 2, 0)  # mean of each patch's points
    torch.testing.assert_close(coarse.points(), centres)
    assert coarse.spacing == pytest.approx([2 * s for s in grid.spacing])
    if roll[1]:
        assert coarse.upper[1] - coarse.lower[1] == pytest.approx(360.0)  # the period is kept
    expected = 2 * block_params() + 16 * 16 * 4 + 16  # blocks + patch convolution
    assert sum(p.numel() for p in proc.parameters()) == expected


def test_vit_patch_3d_and_without_patch():
    grid = make_grid((4, 8, 8), (False, False, True))
    states = ViTProcessor(grid, layers=1, patch=[1, 2, 4], **SMALL)(latent(grid))
    assert states[0].tokens.shape == (2, 4, 4, 2, 16) and states[0].grid.shape == (4, 4, 2)
    grid = make_grid((6, 10))
    proc = ViTProcessor(grid, layers=3, **SMALL)
    reference = [SelfAttentionBlock(**SMALL) for _ in range(3)]
    for ref, block in zip(reference, proc.blocks, strict=True):
        ref.load_state_dict(block.state_dict())
    lat = latent(grid)
    states = proc(lat)
    z = lat.tokens.reshape(2, -1, 16)
    for ref, state in zip(reference, states, strict=True):
        z = ref(z)
        assert state.grid is grid
        torch.testing.assert_close(state.tokens, z.reshape(lat.tokens.shape), atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in proc.parameters()) == 3 * block_params()


def test_vit_errors_are_actionable():
    with pytest.raises(ValueError, match=r"dimension 0 has 10 points.*patch 4.*multiples of 4 \(e\.g\. 8 or 12\)"):
        ViTProcessor(make_grid((10, 8)), patch=4, **SMALL)
    with pytest.raises(ValueError, match=r"leaves 1 point along ordinary grid dimension 1"):
        ViTProcessor(make_grid((8, 4)), patch=[2, 4], **SMALL)
    proc = ViTProcessor(make_grid((8, 8)), patch=2, **SMALL)
    with pytest.raises(ValueError, match=r"built for grid shape \[8, 8\]"):
        proc(Latent(torch.randn(1, 8, 6, 16)))


def test_te_perceiver_initial_locations_follow_eq_11_with_the_learned_offset():
    """Eq. 11: ``x_u_m = v0_m + sum_n softmax_n(q(u_m) . k(z_n) / sqrt(Dh)) x_n``, written as a loop; with the
    offset the pseudo-locations can leave the convex hull of the context."""
    torch.manual_seed(0)
    proc = TEPerceiverProcessor(dim=16, dim_x=2, num_tokens=3, layers=1, heads=2, head_dim=8, mlp_dim=16)
    with torch.no_grad():
        proc.location_offset.copy_(torch.tensor([[5.0, -4.0], [0.0, 0.0], [-3.0, 2.0]]))
    b, n = 2, 5
    zc, xc = torch.randn(b, n, 16), torch.rand(b, n, 2)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, 3:] = False
    u = proc.initial(b, zc.dtype)
    got = proc.initial_locations(u, zc, xc, mask)
    want = torch.zeros(b, 3, 2)
    for i in range(b):
        for m in range(3):
            q = proc.location_query(u[i, m])
            valid = [j for j in range(n) if mask[i, j]]
            logits = torch.stack([q @ proc.location_key(zc[i, j]) / math.sqrt(8) for j in valid])
            weights = torch.softmax(logits, 0)
            want[i, m] = proc.location_offset[m] + sum(w * xc[i, j] for w, j in zip(weights, valid, strict=True))
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
    assert (got[:, 0, 0] > 1.0).all()  # outside the context's hull [0, 1]^2
