"""Grid encoders (PT-GE, Avg-GE, KI-GE options, multi-source) against independent references."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from gridtnp.nn.grid_encoders import (
    AverageGridEncoder,
    KernelInterpolationEncoder,
    MultiSourceGridEncoder,
    PseudoTokenGridEncoder,
)
from gridtnp.nn.grids import Grid, coarsen_grid, great_circle, se_weights
from gridtnp.nn.tokens import Tokens
from gridtnp.registry import build_from_spec
from tests.conftest import grid_coords
from tests.nn.test_grid_decoders import offset_in_spacings

GRID = Grid([-1.0, 0.0], [1.0, 6.0], [5, 6], roll=[False, True])  # spacing (0.5, 1.0), dim 1 rolled


def random_tokens(b: int, n: int, c: int, grid: Grid, valid: list[int], margin: float = 0.0) -> Tokens:
    """Points uniform in the grid's box (shrunk by ``margin`` cells), the first ``valid[b]`` of each task real."""
    step = torch.tensor(grid.spacing)
    lo, hi = torch.tensor(grid.lower) + margin * step, torch.tensor(grid.upper) - margin * step
    x = lo + (hi - lo) * torch.rand(b, n, grid.ndim)
    mask = torch.arange(n)[None] < torch.tensor(valid)[:, None]
    return Tokens(x, torch.randn(b, n, c), mask)


def cell_distances(x: list[float], grid: Grid) -> list[float]:
    """Squared distance (in units of the spacing, rolled dims wrapped) from ``x`` to every grid point, by hand."""
    out = []
    for g in grid_coords(grid):
        total = 0.0
        for d in range(grid.ndim):
            diff = x[d] - g[d]
            if grid.roll[d]:
                period = grid.upper[d] - grid.lower[d]
                diff = (diff + period / 2) % period - period / 2
            total += (diff / grid.spacing[d]) ** 2
        out.append(total)
    return out


def nearest_cells(x: list[float], grid: Grid, k: int) -> list[int]:
    """Flat indices of the ``k`` neighbours of ``x`` by hand, as ``Grid.neighbours`` defines them.

    Candidates are the ``s = ceil(k^(1/d))`` nearest integers per dimension (off an ordinary dimension's edge
    dropped, rolled ones wrapped); the ``k`` nearest candidates are kept. For ``k = 1`` that is the nearest
    grid point; for ``k = s^d`` it is the whole hypercube (not always the exact ``k`` nearest of the grid).
    """
    s = math.ceil(round(k ** (1 / grid.ndim), 9))
    per_dim = []
    for d in range(grid.ndim):
        u = (x[d] - grid.lower[d]) / grid.spacing[d]
        near = sorted(range(math.floor(u) - s, math.floor(u) + s + 2), key=lambda i, u=u: abs(u - i))[:s]
        m = grid.shape[d]
        per_dim.append([i % m for i in near] if grid.roll[d] else [i for i in near if 0 <= i < m])
    dist = cell_distances(x, grid)
    flat = [sum(i * math.prod(grid.shape[d + 1 :]) for d, i in enumerate(idx)) for idx in itertools.product(*per_dim)]
    return sorted(flat, key=dist.__getitem__)[:k]


def naive_block(
    enc: PseudoTokenGridEncoder, q: torch.Tensor, kv: torch.Tensor, rel: torch.Tensor | None = None
) -> torch.Tensor:
    """Pre-norm MHCA + MLP for one query ``[D]`` and keys ``[n, D]``, written out from the weights; ``rel [n, 2 H Dh]``
    is added to the projected keys and values."""
    blk, attn = enc.block, enc.block.attn
    dim = q.shape[-1]
    h, dh = attn.heads, attn.head_dim
    qn = F.layer_norm(q, (dim,), blk.norm_q.weight, blk.norm_q.bias)
    out = torch.zeros(dim)
    if kv.shape[0] > 0:
        kvn = F.layer_norm(kv, (dim,), blk.norm_kv.weight, blk.norm_kv.bias)
        qh = (qn @ attn.to_q.weight.T).view(h, dh)
        projected = kvn @ attn.to_kv.weight.T
        keys, values = (projected if rel is None else projected + rel).split(h * dh, dim=-1)
        keys, values = keys.view(-1, h, dh), values.view(-1, h, dh)
        heads = []
        for i in range(h):
            p = torch.softmax(keys[:, i] @ qh[i] / math.sqrt(dh), dim=0)
            heads.append(p @ values[:, i])
        out = torch.cat(heads) @ attn.out.weight.T + attn.out.bias
    u = q + out
    return u + blk.mlp(F.layer_norm(u, (dim,), blk.norm2.weight, blk.norm2.bias))


def naive_pseudo_token(enc: PseudoTokenGridEncoder, t: Tokens, cap: int | None = None) -> torch.Tensor:
    """Loop over tasks and cells: each cell's pseudo-token attends to the points that have it among their k nearest
    (and, with ``self_key``, to itself, as the reference code's ``concatenate_x_grid``)."""
    b, n, _ = t.z.shape
    grid = enc.grid
    m, dim = grid.num_points, enc.pseudo_tokens.shape[-1]
    u0 = enc.pseudo_tokens.reshape(m, dim)
    coords = grid_coords(grid)
    out = torch.zeros(b, m, dim)
    for bi in range(b):
        near = [nearest_cells(t.x[bi, i].tolist(), grid, enc.k) if t.mask[bi, i] else [] for i in range(n)]
        for c in range(m):
            members = [i for i in range(n) if c in near[i]]
            if cap is not None:  # keep the cap nearest points to the cell
                members = sorted(members, key=lambda i: cell_distances(t.x[bi, i].tolist(), grid)[c])[:cap]
            kv = enc.proj_in(t.z[bi, members]) if members else torch.zeros(0, dim)
            offsets = [offset_in_spacings(t.x[bi, i].tolist(), coords[c], grid) for i in members]
            if enc.self_key:
                kv = torch.cat([u0[c : c + 1], kv])
                offsets = [[0.0] * grid.ndim, *offsets]
            rel = None if enc.rel is None else enc.rel(torch.tensor(offsets).view(-1, grid.ndim))
            out[bi, c] = naive_block(enc, u0[c], kv, rel)
    return out.reshape(b, *grid.shape, dim)


def neighbour_mask(t: Tokens, grid: Grid, k: int) -> torch.Tensor:
    """``[B, N, M]`` indicator of each point's ``k`` neighbours, by hand."""
    b, n, _ = t.x.shape
    keep = torch.zeros(b, n, grid.num_points)
    for bi, i in itertools.product(range(b), range(n)):
        keep[bi, i, nearest_cells(t.x[bi, i].tolist(), grid, k)] = 1.0
    return keep


def cell_counts(t: Tokens, grid: Grid, k: int) -> torch.Tensor:
    """Number of points assigned to each cell ``[B, M]``, by brute force."""
    b, n, _ = t.z.shape
    counts = torch.zeros(b, grid.num_points, dtype=torch.long)
    for bi in range(b):
        for i in range(n):
            if t.mask[bi, i]:
                for c in nearest_cells(t.x[bi, i].tolist(), grid, k):
                    counts[bi, c] += 1
    return counts


@pytest.mark.parametrize("k", [1, 3, 4])
def test_pseudo_token_matches_naive_loop(k: int) -> None:
    enc = PseudoTokenGridEncoder(GRID, dim=16, in_dim=3, k=k, heads=2, head_dim=8, mlp_dim=32)
    t = random_tokens(2, 40, 3, GRID, valid=[40, 13])
    out = enc({"p": t})
    assert out.tokens.shape == (2, 5, 6, 16) and out.grid == GRID
    assert (cell_counts(t, GRID, k) == 0).any()  # some empty cells are exercised
    torch.testing.assert_close(out.tokens, naive_pseudo_token(enc, t), atol=1e-5, rtol=1e-4)


def test_pseudo_token_padding_cap_and_order() -> None:
    enc = PseudoTokenGridEncoder(GRID, dim=16, in_dim=3, heads=2, head_dim=8, mlp_dim=32)
    t = random_tokens(2, 60, 3, GRID, valid=[60, 35])
    ref = enc({"p": t}).tokens
    # Extra masked junk (NaN locations and values) changes nothing.
    junk = Tokens(torch.full((2, 5, 2), float("nan")), torch.full((2, 5, 3), float("nan")), torch.zeros(2, 5).bool())
    torch.testing.assert_close(enc({"p": t, "junk": junk}).tokens, ref)
    # Context order does not matter.
    perm = torch.randperm(60)
    torch.testing.assert_close(enc({"p": Tokens(t.x[:, perm], t.z[:, perm], t.mask[:, perm])}).tokens, ref)
    # A cap at or above the fullest cell changes nothing; a lower cap changes only the cells above it.
    counts = cell_counts(t, GRID, 1)
    fullest = int(counts.max())
    enc.max_tokens_per_cell = fullest
    torch.testing.assert_close(enc({"p": t}).tokens, ref)
    cap = max(1, fullest - 2)
    enc.max_tokens_per_cell = cap
    capped = enc({"p": t}).tokens
    over = (counts > cap).view(2, 5, 6)
    assert over.any()
    torch.testing.assert_close(capped[~over], ref[~over])
    assert not torch.allclose(capped[over], ref[over])
    torch.testing.assert_close(capped, naive_pseudo_token(enc, t, cap=cap), atol=1e-5, rtol=1e-4)
    # The capped result keeps the nearest points, so it does not depend on the order either.
    shuffled = Tokens(t.x[:, perm], t.z[:, perm], t.mask[:, perm])
    torch.testing.assert_close(enc({"p": shuffled}).tokens, capped)


@pytest.mark.parametrize(
    ("self_key", "relative_position"), [(True, False), (False, False), (True, True), (False, True)]
)
def test_pseudo_token_self_key_and_cap_match_naive_loop(self_key: bool, relative_position: bool) -> None:
    enc = PseudoTokenGridEncoder(
        GRID,
        dim=16,
        in_dim=3,
        k=3,
        heads=2,
        head_dim=8,
        mlp_dim=32,
        self_key=self_key,
        relative_position=relative_position,
    )
    enc.max_tokens_per_cell = 2
    t = random_tokens(2, 40, 3, GRID, valid=[40, 13])
    torch.testing.assert_close(enc({"p": t}).tokens, naive_pseudo_token(enc, t, cap=2), atol=1e-5, rtol=1e-4)
    if relative_position:  # the same tokens elsewhere in their cells give other pseudo-tokens
        moved = Tokens(t.x + 0.1, t.z, t.mask)
        assert not torch.allclose(enc({"p": moved}).tokens, enc({"p": t}).tokens)


@pytest.mark.parametrize(
    ("k", "self_key", "relative_position", "cap"),
    [(1, True, False, None), (4, True, True, None), (3, False, False, 2), (1, False, True, 1)],
)
def test_pseudo_token_values_and_gradients_match_naive_loop_in_float64(
    k: int, self_key: bool, relative_position: bool, cap: int | None
) -> None:
    """The segment attention (no padded buffer) gives the naive per-cell loop's values and gradients."""
    torch.set_default_dtype(torch.float64)
    try:
        enc = PseudoTokenGridEncoder(
            GRID,
            dim=16,
            in_dim=3,
            k=k,
            heads=2,
            head_dim=8,
            mlp_dim=32,
            self_key=self_key,
            relative_position=relative_position,
            max_tokens_per_cell=cap,
        )
        t = random_tokens(2, 30, 3, GRID, valid=[30, 9])
        weight = torch.randn(2, 5, 6, 16)
        grads = []
        for fn in (lambda: enc({"p": t}).tokens, lambda: naive_pseudo_token(enc, t, cap=cap)):
            enc.zero_grad()
            t.z.grad = None
            t.z.requires_grad_(True)
            out = fn()
            (out * weight).sum().backward()
            grads.append((out.detach(), [p.grad.clone() for p in enc.parameters()], t.z.grad.clone()))
        (new, new_p, new_z), (ref, ref_p, ref_z) = grads
        assert new.dtype == torch.float64
        tol = 1e-6 if relative_position else 1e-10  # the encoder takes offsets in float32 (coordinates), by design
        torch.testing.assert_close(new, ref, atol=tol, rtol=tol)
        torch.testing.assert_close(new_z, ref_z, atol=tol, rtol=tol)
        for a, b in zip(new_p, ref_p, strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    finally:
        torch.set_default_dtype(torch.float32)


def test_pseudo_token_empty_cells_attend_to_their_own_initial_token() -> None:
    """With self_key (the default) an empty cell's attention output is W_O v(u0_m), not zero."""
    enc = PseudoTokenGridEncoder(GRID, dim=16, heads=2, head_dim=8, mlp_dim=32)
    assert enc.self_key
    t = Tokens(torch.zeros(1, 0, 2), torch.zeros(1, 0, 16), torch.zeros(1, 0).bool())
    out = enc({"p": t}).tokens[0].reshape(-1, 16)
    u0 = enc.pseudo_tokens.reshape(-1, 16)
    blk, attn = enc.block, enc.block.attn
    _, v = (attn.to_kv(blk.norm_kv(u0))).chunk(2, dim=-1)  # softmax over one key is 1: the output is its value
    u = u0 + attn.out(v)
    torch.testing.assert_close(out, u + blk.mlp(blk.norm2(u)), atol=1e-5, rtol=1e-5)
    zero_update = u0 + blk.mlp(blk.norm2(u0))
    assert (out - zero_update).abs().amax(-1).min() > 1e-3  # every empty cell moved


def test_pseudo_token_empty_context_and_gradients() -> None:
    enc = PseudoTokenGridEncoder(GRID, dim=16, heads=2, head_dim=8, mlp_dim=32, self_key=False)
    u0 = enc.pseudo_tokens
    prior = u0 + enc.block.mlp(enc.block.norm2(u0))
    for n in (0, 4):  # no points at all, and only padding
        t = Tokens(torch.full((2, n, 2), float("nan")), torch.full((2, n, 16), float("nan")), torch.zeros(2, n).bool())
        out = enc({"p": t}).tokens
        torch.testing.assert_close(out, prior.expand_as(out))
    # Sparse context (mostly empty cells) plus padding: finite values and gradients everywhere.
    t = random_tokens(3, 5, 16, GRID, valid=[5, 1, 0])
    t.x[0, -1] = float("nan")
    t.mask[0, -1] = False
    t.z.requires_grad_(True)
    out = enc({"p": t}).tokens
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    grads = [p.grad for p in enc.parameters()] + [t.z.grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert enc.block.attn.to_kv.weight.grad.abs().sum() > 0


def test_pseudo_token_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="needs the model's grid"):
        PseudoTokenGridEncoder(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens_per_cell"):
        PseudoTokenGridEncoder(GRID, max_tokens_per_cell=0)
    with pytest.raises(ValueError, match="in_dim=8"):
        PseudoTokenGridEncoder(GRID, dim=16, in_dim=8)({"p": random_tokens(1, 3, 4, GRID, valid=[3])})
    enc = build_from_spec("grid_encoder", {"name": "pseudo_token", "k": 4}, grid=GRID, dim=16, in_dim=16, dim_x=2)
    assert isinstance(enc, PseudoTokenGridEncoder) and enc.k == 4


def test_average_matches_naive_loop() -> None:
    enc = AverageGridEncoder(GRID, dim=6, in_dim=3)
    with torch.no_grad():
        enc.empty.normal_()
    t = random_tokens(2, 30, 3, GRID, valid=[30, 9])
    pad = Tokens(torch.full((2, 2, 2), torch.nan), torch.full((2, 2, 3), torch.nan), torch.zeros(2, 2).bool())
    out = enc({"p": t, "pad": pad})
    ref = torch.zeros(2, GRID.num_points, 6)
    for bi in range(2):
        for c in range(GRID.num_points):
            members = [i for i in range(30) if t.mask[bi, i] and nearest_cells(t.x[bi, i].tolist(), GRID, 1) == [c]]
            ref[bi, c] = enc.proj(t.z[bi, members].mean(0)) if members else enc.empty
    torch.testing.assert_close(out.tokens, ref.view(2, 5, 6, 6), atol=1e-5, rtol=1e-5)
    # Same width: no projection.
    assert isinstance(AverageGridEncoder(GRID, dim=3, in_dim=3).proj, torch.nn.Identity)


@pytest.mark.parametrize("nearest_only", [False, True])
def test_kernel_interpolation_shift_by_grid_cells(nearest_only: bool) -> None:
    grid = Grid([0.0, 0.0], [4.0, 2.0], [21, 11])  # spacing 0.2
    enc = KernelInterpolationEncoder(grid, in_dim=2, dim=3, nearest_only=nearest_only)
    t = random_tokens(2, 15, 2, grid, valid=[15, 8], margin=4.0)
    shift = torch.tensor([3 * 0.2, -2 * 0.2])
    a, b = enc({"p": t}).tokens, enc({"p": Tokens(t.x + shift, t.z, t.mask)}).tokens
    torch.testing.assert_close(b[:, 3:, :-2], a[:, :-3, 2:], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(("k", "density"), [(None, True), (4, True), (None, False)])
def test_kernel_interpolation_nearest_only_is_restricted_dense(k: int | None, density: bool) -> None:
    enc = KernelInterpolationEncoder(GRID, in_dim=3, dim=5, nearest_only=True, k=k, density=density)
    t = random_tokens(2, 12, 3, GRID, valid=[12, 7])
    out = enc({"p": t}).tokens
    # Dense kernel weights, then all but each point's k nearest locations zeroed.
    w = se_weights(t.x, GRID, enc.lengthscale, t.mask) * neighbour_mask(t, GRID, k or 1)
    z = torch.where(t.mask.unsqueeze(-1), t.z, 0.0)
    h = w.transpose(1, 2) @ z
    if density:
        dens = w.sum(1).unsqueeze(-1)
        h = torch.cat([h / (dens + enc.eps), torch.log1p(dens)], dim=-1)
    ref = enc.proj(h).view(2, 5, 6, 5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="nearest_only"):
        KernelInterpolationEncoder(GRID, in_dim=3, k=4)


def naive_haversine_km(a: list[float], b: list[float]) -> float:
    """Haversine formula with ``math``, Earth radius 6371 km."""
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6371.0 * math.asin(math.sqrt(h))


def test_great_circle_distance() -> None:
    london, paris = torch.tensor([51.5074, -0.1278]), torch.tensor([48.8566, 2.3522])
    assert great_circle(london, paris).item() == pytest.approx(343.5, abs=0.5)
    assert great_circle(london, paris, radius=1.0).item() == pytest.approx(343.56 / 6371.0, rel=1e-3)
    a = torch.rand(50, 2) * torch.tensor([180.0, 360.0]) - torch.tensor([90.0, 180.0])
    b = torch.rand(50, 2) * torch.tensor([180.0, 360.0]) - torch.tensor([90.0, 180.0])
    torch.testing.assert_close(great_circle(a, b), great_circle(b, a))
    ref = torch.tensor([naive_haversine_km(p.tolist(), q.tolist()) for p, q in zip(a, b, strict=True)])
    torch.testing.assert_close(great_circle(a, b), ref, atol=1e-2, rtol=1e-4)
    # Longitude wraps: 179.9 E and 179.9 W are 0.2 degrees apart on the equator.
    near = great_circle(torch.tensor([0.0, 179.9]), torch.tensor([0.0, -179.9]))
    assert near.item() == pytest.approx(math.radians(0.2) * 6371.0, rel=1e-3)
    # Coincident and antipodal points: exact values and finite gradients.
    x = torch.tensor([[10.0, 20.0], [0.0, 0.0]], requires_grad=True)
    y = torch.tensor([[10.0, 20.0], [0.0, 180.0]])
    d = great_circle(x, y)
    torch.testing.assert_close(d, torch.tensor([0.0, math.pi * 6371.0]))
    d.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_kernel_interpolation_haversine() -> None:
    grid = Grid([0.0, -60.0, -180.0], [1.0, 60.0, 180.0], [2, 5, 8], roll=[False, False, True])  # (time, lat, lon)
    enc = KernelInterpolationEncoder(grid, in_dim=2, dim=4, distance="haversine", lengthscale=[0.7, 3000.0])
    assert enc.lengthscale.shape == (2,)
    t = random_tokens(2, 6, 2, grid, valid=[6, 3])
    t.x[0, 0, 2] = 179.9  # next to the grid's -180 column across the date line
    out = enc({"p": t}).tokens
    feats = torch.zeros(2, grid.num_points, 3)
    for bi, (m, g) in itertools.product(range(2), enumerate(grid_coords(grid))):
        for i in range(6):
            if t.mask[bi, i]:
                xi = t.x[bi, i].tolist()
                r = naive_haversine_km(xi[1:], g[1:]) / 3000.0
                w = math.exp(-0.5 * (((xi[0] - g[0]) / 0.7) ** 2 + r**2))
                feats[bi, m] += w * torch.cat([t.z[bi, i], torch.ones(1)])
    feats = torch.cat([feats[..., :2] / (feats[..., 2:] + enc.eps), torch.log1p(feats[..., 2:])], dim=-1)
    torch.testing.assert_close(out, enc.proj(feats).view(2, 2, 5, 8, 4), atol=1e-5, rtol=1e-4)
    # nearest_only: the same kernel restricted to the nearest location.
    sparse = KernelInterpolationEncoder(grid, in_dim=2, dim=4, distance="haversine", nearest_only=True)
    sparse.load_state_dict(enc.state_dict())
    w = enc.dense_weights(t.x, t.mask) * neighbour_mask(t, grid, 1)  # nearest in (time, lat, lon) coordinates
    h = w.transpose(1, 2) @ torch.cat([torch.where(t.mask.unsqueeze(-1), t.z, 0.0), torch.ones(2, 6, 1)], -1)
    h = torch.cat([h[..., :2] / (h[..., 2:] + enc.eps), torch.log1p(h[..., 2:])], dim=-1)
    torch.testing.assert_close(sparse({"p": t}).tokens, enc.proj(h).view(2, 2, 5, 8, 4), atol=1e-5, rtol=1e-4)
    # Default length-scales: 2 x time spacing, 2 x the coarser of the lat/lon spacings in km.
    default = KernelInterpolationEncoder(grid, in_dim=2, distance="haversine")
    torch.testing.assert_close(default.lengthscale, torch.tensor([2.0, 2 * math.radians(45.0) * 6371.0]))
    with pytest.raises(ValueError, match="one in km"):
        KernelInterpolationEncoder(grid, in_dim=2, distance="haversine", lengthscale=[1.0, 2.0, 3.0])


def test_coarsen_grid_centres() -> None:
    fine = Grid([0.0, -1.0, -180.0], [3.0, 1.0, 180.0], [4, 6, 8], roll=[False, False, True])
    coarse = coarsen_grid(fine, 2)
    assert coarse.shape == (2, 3, 4) and coarse.roll == fine.roll
    # Centres = the mean of each 2 x 2 x 2 block of fine points.
    pts = fine.points()  # [4, 6, 8, 3]
    blocks = pts.view(2, 2, 3, 2, 4, 2, 3).mean(dim=(1, 3, 5))
    torch.testing.assert_close(coarse.points(), blocks)
    assert coarse.spacing == pytest.approx(tuple(2 * s for s in fine.spacing))
    assert coarsen_grid(fine, [1, 3, 1]).shape == (4, 2, 8)
    assert coarsen_grid(fine, 1) == fine
    with pytest.raises(ValueError, match="does not divide"):
        coarsen_grid(fine, [1, 4, 1])
    with pytest.raises(ValueError, match="at least 2"):
        coarsen_grid(fine, [4, 1, 1])


@pytest.mark.parametrize("name", ["pseudo_token", "average", "kernel_interpolation"])
def test_encoders_coarsen(name: str) -> None:
    fine = Grid([-1.0, 0.0], [1.0, 6.0], [6, 6], roll=[False, True])
    spec = {"name": name, "coarsen": 2}
    enc = build_from_spec("grid_encoder", spec, grid=fine, dim=8, in_dim=8)
    t = random_tokens(2, 20, 8, fine, valid=[20, 10])
    out = enc({"p": t})
    coarse = coarsen_grid(fine, 2)
    assert out.grid == coarse and out.tokens.shape == (2, 3, 3, 8)
    # The same as encoding onto the coarse grid directly.
    direct = build_from_spec("grid_encoder", {"name": name}, grid=coarse, dim=8, in_dim=8)
    direct.load_state_dict(enc.state_dict())
    torch.testing.assert_close(direct({"p": t}).tokens, out.tokens)


@pytest.mark.parametrize("merge", ["concat", "sum"])
def test_multi_source(merge: str) -> None:
    spec = {"name": "multi", "sources": ["a", "b"], "encoder": {"name": "pseudo_token", "k": 4}, "merge": merge}
    enc = build_from_spec("grid_encoder", spec, grid=GRID, dim=16, in_dim=16, dim_x=2)
    assert isinstance(enc, MultiSourceGridEncoder)
    ta, tb = random_tokens(2, 10, 16, GRID, valid=[10, 4]), random_tokens(2, 7, 16, GRID, valid=[3, 7])
    out = enc({"a": ta, "b": tb})
    assert out.tokens.shape == (2, 5, 6, 16) and out.grid == GRID
    torch.testing.assert_close(enc({"b": tb, "a": ta}).tokens, out.tokens)
    # Each source goes to its own encoder; a missing source is one with no observations.
    ga, gb = enc.encoders["a"]({"a": ta}).tokens, enc.encoders["b"]({"b": tb}).tokens
    ref = ga + gb if merge == "sum" else enc.proj(torch.cat([ga, gb], -1))
    torch.testing.assert_close(out.tokens, ref)
    empty_b = Tokens(tb.x[:, :0], tb.z[:, :0], tb.mask[:, :0])
    torch.testing.assert_close(enc({"a": ta}).tokens, enc({"a": ta, "b": empty_b}).tokens)
    with pytest.raises(ValueError, match="not built for"):
        enc({"a": ta, "c": tb})


def test_multi_source_per_source_specs_and_errors() -> None:
    encoders = {"a": {"name": "average"}, "b": {"name": "pseudo_token"}}
    spec = {"name": "multi", "sources": ["a", "b"], "encoder": encoders}
    enc = build_from_spec("grid_encoder", spec, grid=GRID, dim=8, in_dim=4)
    assert isinstance(enc.encoders["a"], AverageGridEncoder) and isinstance(enc.encoders["b"], PseudoTokenGridEncoder)
    t = random_tokens(1, 5, 4, GRID, valid=[5])
    assert enc({"a": t, "b": t}).tokens.shape == (1, 5, 6, 8)
    with pytest.raises(ValueError, match="merge"):
        MultiSourceGridEncoder(GRID, ["a"], merge="max")
    with pytest.raises(ValueError, match="one per source"):
        MultiSourceGridEncoder(GRID, ["a", "b"], encoder={"a": {"name": "average"}})
    with pytest.raises(ValueError, match="different grids"):
        bad = {"a": {"name": "average", "coarsen": [1, 2]}, "b": {"name": "average"}}
        MultiSourceGridEncoder(GRID, ["a", "b"], dim=4, encoder=bad, merge="sum")({"a": t, "b": t})


def test_multi_source_with_coarsen_tells_the_model_its_coarse_grid() -> None:
    """The processor and decoder are built for the grid the inner encoders write to, not the model's."""
    from gridtnp.batch import Observations
    from gridtnp.models import build_model

    spec = {
        "dim_x": 2,
        "dim_y": {"a": 1, "b": 1},
        "target_source": "a",
        "dim": 8,
        "grid": {"lower": [-1.0, -1.0], "upper": [1.0, 1.0], "shape": [8, 8]},
        "encoder": {"name": "mlp"},
        "grid_encoder": {"name": "multi", "encoder": {"name": "average", "coarsen": 2}},
        "processor": {"name": "cnn", "layers": 1, "channels": 8},
        "grid_decoder": {"name": "knn", "k": 4, "layers": 1},
        "likelihood": {"name": "gaussian"},
    }
    model = build_model(spec)
    assert model.processor.grid.shape == (4, 4) and model.grid_encoder.grid.shape == (4, 4)
    x = torch.rand(2, 5, 2) * 2 - 1
    context = {"a": Observations(x, torch.randn(2, 5, 1)), "b": Observations(x.flip(1), torch.randn(2, 5, 1))}
    assert model(context, torch.rand(2, 3, 2) * 2 - 1).mean.shape == (2, 3, 1)
