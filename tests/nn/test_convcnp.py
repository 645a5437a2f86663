"""ConvCNP components: kernel-interpolation (SetConv) encoder / decoder, CNN and U-Net processors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gridtnp.nn.likelihoods  # noqa: F401  (registers the 'gaussian' likelihood)
from gridtnp.nn.grid_decoders import KernelInterpolationDecoder
from gridtnp.nn.grid_encoders import KernelInterpolationEncoder
from gridtnp.nn.grids import Grid, se_weights
from gridtnp.nn.processors import CNNProcessor, GridConv, GridConvTranspose, UNetProcessor
from gridtnp.nn.tokens import Latent, Tokens
from gridtnp.registry import build, build_from_spec
from tests.conftest import grid_coords

torch.manual_seed(0)


def naive_kernel(x: list[float], g: list[float], grid: Grid, lengthscale: list[float]) -> float:
    """SE kernel between one point and one grid point, wrapping rolled dims by hand (independent of Grid)."""
    total = 0.0
    for d in range(grid.ndim):
        diff = x[d] - g[d]
        if grid.roll[d]:
            period = grid.upper[d] - grid.lower[d]
            diff = (diff + period / 2) % period - period / 2
        total += (diff / lengthscale[d]) ** 2
    return math.exp(-0.5 * total)


def naive_encoder(enc: KernelInterpolationEncoder, t: Tokens) -> torch.Tensor:
    """Double loop over grid points and context points, then the encoder's own Linear."""
    ls = enc.lengthscale.tolist()
    b, n, c = t.z.shape
    coords = grid_coords(enc.grid)
    feats = torch.zeros(b, len(coords), c + 1, dtype=torch.float64)
    for bi in range(b):
        for m, g in enumerate(coords):
            h, dens = torch.zeros(c, dtype=torch.float64), 0.0
            for i in range(n):
                if t.mask[bi, i]:
                    k = naive_kernel(t.x[bi, i].tolist(), g, enc.grid, ls)
                    h += k * t.z[bi, i].double()
                    dens += k
            feats[bi, m, :c] = h / (dens + enc.eps)
            feats[bi, m, c] = math.log1p(dens)
    out = feats.float() @ enc.proj.weight.T + enc.proj.bias
    return out.reshape(b, *enc.grid.shape, -1)


def random_tokens(b: int, n: int, c: int, grid: Grid, valid: list[int]) -> Tokens:
    lo, hi = torch.tensor(grid.lower), torch.tensor(grid.upper)
    x = lo + (hi - lo) * torch.rand(b, n, grid.ndim)
    mask = torch.arange(n)[None] < torch.tensor(valid)[:, None]
    return Tokens(x, torch.randn(b, n, c), mask)


GRID_2D = Grid([-1.0, 0.0], [1.0, 6.0], [5, 6], roll=[False, True])


def test_se_weights_match_naive_kernel() -> None:
    grid = Grid([0.0, -1.0, 0.0], [1.0, 1.0, 2.0], [3, 4, 2], roll=[False, True, False])
    x = torch.rand(2, 3, 3) * 2 - 0.5
    ls = [0.3, 0.5, 0.7]
    w = se_weights(x, grid, torch.tensor(ls))
    coords = grid_coords(grid)
    ref = torch.tensor(
        [[[naive_kernel(x[b, n].tolist(), g, grid, ls) for g in coords] for n in range(3)] for b in range(2)]
    )
    assert w.shape == (2, 3, grid.num_points)
    torch.testing.assert_close(w, ref, atol=1e-6, rtol=1e-5)


def test_encoder_matches_double_loop_with_padding() -> None:
    enc = KernelInterpolationEncoder(GRID_2D, in_dim=3, dim=8, lengthscale=[0.4, 0.9])
    t = random_tokens(2, 7, 3, GRID_2D, valid=[7, 4])
    out = enc({"points": t}).tokens
    assert out.shape == (2, 5, 6, 8)
    torch.testing.assert_close(out, naive_encoder(enc, t), atol=1e-5, rtol=1e-4)


def test_encoder_ignores_padding_and_order() -> None:
    enc = KernelInterpolationEncoder(GRID_2D, in_dim=3, dim=8)
    t = random_tokens(2, 6, 3, GRID_2D, valid=[6, 6])
    ref = enc({"points": t}).tokens
    # Padded points with NaN locations and values must not change anything.
    pad_x = torch.full((2, 3, 2), float("nan"))
    pad_z = torch.full((2, 3, 3), float("nan"))
    pad_mask = torch.zeros(2, 3, dtype=torch.bool)
    padded = Tokens(torch.cat([t.x, pad_x], 1), torch.cat([t.z, pad_z], 1), torch.cat([t.mask, pad_mask], 1))
    torch.testing.assert_close(enc({"points": padded}).tokens, ref)
    perm = torch.randperm(6)
    permuted = Tokens(t.x[:, perm], t.z[:, perm], t.mask[:, perm])
    torch.testing.assert_close(enc({"points": permuted}).tokens, ref, atol=1e-5, rtol=1e-5)
    # Two sources are their union.
    first, second = (Tokens(t.x[:, s], t.z[:, s], t.mask[:, s]) for s in (slice(0, 2), slice(2, 6)))
    torch.testing.assert_close(enc({"a": first, "b": second}).tokens, ref, atol=1e-5, rtol=1e-5)


def test_encoder_chunked_equals_unchunked() -> None:
    t = random_tokens(2, 11, 2, GRID_2D, valid=[11, 5])
    full = KernelInterpolationEncoder(GRID_2D, in_dim=2, dim=4)
    chunked = KernelInterpolationEncoder(GRID_2D, in_dim=2, dim=4, chunk_size=3)
    chunked.load_state_dict(full.state_dict())
    torch.testing.assert_close(chunked({"p": t}).tokens, full({"p": t}).tokens, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("density", [True, False])
def test_encoder_empty_context_is_finite(density: bool) -> None:
    enc = KernelInterpolationEncoder(GRID_2D, in_dim=2, dim=4, density=density)
    t = random_tokens(2, 4, 2, GRID_2D, valid=[0, 0])
    out = enc({"p": t}).tokens
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, enc.proj.bias.expand_as(out))  # no data: zero features, only the bias
    # A context with zero points along N works too.
    empty = Tokens(torch.zeros(2, 0, 2), torch.zeros(2, 0, 2), torch.zeros(2, 0, dtype=torch.bool))
    torch.testing.assert_close(enc({"p": empty}).tokens, out)


def test_encoder_shift_by_grid_cells_shifts_encoding() -> None:
    grid = Grid([0.0], [10.0], [51])  # spacing 0.2
    enc = KernelInterpolationEncoder(grid, in_dim=1, dim=3, lengthscale=0.3)
    t = Tokens(torch.rand(1, 6, 1) * 2 + 3, torch.randn(1, 6, 1), torch.ones(1, 6, dtype=torch.bool))
    shifted = Tokens(t.x + 3 * 0.2, t.z, t.mask)
    a, b = enc({"p": t}).tokens, enc({"p": shifted}).tokens
    torch.testing.assert_close(b[:, 3:], a[:, :-3], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(a, b)
    # Along a rolled dimension the shift wraps around: the whole encoding rolls, boundary included.
    enc2 = KernelInterpolationEncoder(GRID_2D, in_dim=1, dim=3)
    t2 = random_tokens(1, 5, 1, GRID_2D, valid=[5])
    step = GRID_2D.spacing[1]
    shifted2 = Tokens(t2.x + torch.tensor([0.0, 4 * step]), t2.z, t2.mask)
    torch.testing.assert_close(
        enc2({"p": shifted2}).tokens, enc2({"p": t2}).tokens.roll(4, dims=2), atol=1e-5, rtol=1e-4
    )


def test_encoder_lengthscale_learnable_or_fixed() -> None:
    t = random_tokens(1, 4, 1, GRID_2D, valid=[4])
    enc = KernelInterpolationEncoder(GRID_2D, in_dim=1, dim=2)
    torch.testing.assert_close(enc.lengthscale, 2 * torch.tensor(GRID_2D.spacing))
    enc({"p": t}).tokens.square().sum().backward()
    assert enc.log_lengthscale.grad is not None and enc.log_lengthscale.grad.abs().sum() > 0
    fixed = KernelInterpolationEncoder(GRID_2D, in_dim=1, dim=2, learn_lengthscale=False, lengthscale=0.5)
    assert "log_lengthscale" not in dict(fixed.named_parameters())
    torch.testing.assert_close(fixed.lengthscale, torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="one per grid dimension"):
        KernelInterpolationEncoder(GRID_2D, in_dim=1, lengthscale=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="in_dim=2"):
        KernelInterpolationEncoder(GRID_2D, in_dim=2)({"p": t})


def test_decoder_matches_naive_loop() -> None:
    dec = KernelInterpolationDecoder(GRID_2D, dim=4, lengthscale=[0.5, 0.8])
    u = torch.randn(2, 5, 6, 4)
    xt = torch.rand(2, 3, 2) * torch.tensor([2.0, 6.0]) - torch.tensor([1.0, 0.0])
    out = dec([Latent(u, grid=GRID_2D)], torch.randn(2, 3, 4), xt)
    coords, ls = grid_coords(GRID_2D), dec.lengthscale.tolist()
    ref = torch.zeros(2, 3, 4)
    flat = u.reshape(2, -1, 4)
    for b in range(2):
        for n in range(3):
            for m, g in enumerate(coords):
                ref[b, n] += naive_kernel(xt[b, n].tolist(), g, GRID_2D, ls) * flat[b, m]
    torch.testing.assert_close(out, dec.proj(ref), atol=1e-5, rtol=1e-4)
    chunked = KernelInterpolationDecoder(GRID_2D, dim=4, chunk_size=2)
    chunked.load_state_dict(dec.state_dict())
    torch.testing.assert_close(chunked([Latent(u, grid=GRID_2D)], None, xt), out)  # zt is ignored
    with pytest.raises(ValueError, match="layers must be 1"):
        KernelInterpolationDecoder(GRID_2D, layers=2)
    with pytest.raises(ValueError, match="grid tokens"):
        dec([Latent(u[:, :4], grid=GRID_2D)], None, xt)


@pytest.mark.parametrize("roll", [(False,), (True,), (False, False), (True, True)])
def test_grid_convs_match_torch_padding(roll: tuple[bool, ...]) -> None:
    """Explicit padding equals torch's zero / circular padded convs (torch's one mode for all dims)."""
    d = len(roll)
    grid = Grid([0.0] * d, [1.0] * d, [8] * d, roll=roll)
    mode = "circular" if roll[0] else "zeros"
    conv_cls, convt_cls = (nn.Conv1d, nn.ConvTranspose1d) if d == 1 else (nn.Conv2d, nn.ConvTranspose2d)
    x = torch.randn(2, 3, *[8] * d)
    for stride in (1, 2):
        ours = GridConv("test", grid, 3, 4, 5, stride=stride)
        ref = conv_cls(3, 4, 5, stride=stride, padding=2, padding_mode=mode)
        ref.load_state_dict(ours.conv.state_dict())
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    if not roll[0]:  # torch's transposed convs only zero-pad
        ours_t = GridConvTranspose("test", grid, 3, 4, 5)
        ref_t = convt_cls(3, 4, 5, stride=2, padding=2, output_padding=1)
        ref_t.load_state_dict(ours_t.conv.state_dict())
        torch.testing.assert_close(ours_t(x), ref_t(x), atol=1e-5, rtol=1e-5)


def test_transposed_conv_is_periodic_along_rolled_dims() -> None:
    grid = Grid([0.0], [1.0], [8], roll=[True])
    up = GridConvTranspose("test", grid, 2, 3, 5)
    x = torch.randn(1, 2, 8)
    out = up(x)
    assert out.shape == (1, 3, 16)
    # Rolling the input by one cell rolls the upsampled output by two, seam included.
    torch.testing.assert_close(up(x.roll(1, -1)), out.roll(2, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "shape, roll",
    [
        ((32,), (False,)),
        ((37,), (False,)),
        ((16, 16), (False, False)),
        ((20, 13), (False, False)),
        ((20, 16), (False, True)),
    ],
)
@pytest.mark.parametrize("kind", ["cnn", "unet"])
def test_conv_processors_preserve_shape(kind: str, shape: tuple[int, ...], roll: tuple[bool, ...]) -> None:
    grid = Grid([0.0] * len(shape), [1.0] * len(shape), shape, roll=roll)
    proc = build_from_spec("processor", {"name": kind}, dim=16, grid=grid, dim_x=len(shape), dim_y=1)
    u = torch.randn(2, *shape, 16)
    states = proc(Latent(u, grid=grid))
    assert proc.num_states == len(states) == 1
    assert states[0].tokens.shape == u.shape and states[0].grid is grid
    assert torch.isfinite(states[0].tokens).all()


@pytest.mark.parametrize("kind", ["cnn", "unet"])
def test_conv_processors_3d(kind: str) -> None:
    grid = Grid([0.0] * 3, [1.0] * 3, [6, 5, 8], roll=[False, False, True])
    kwargs = {"channels": (4, 4, 4)} if kind == "unet" else {"channels": 4, "layers": 2}
    proc = build("processor", kind, grid=grid, dim=4, kernel_size=3, **kwargs)
    u = torch.randn(1, 6, 5, 8, 4)
    out = proc(Latent(u, grid=grid))[0].tokens
    assert out.shape == u.shape
    torch.testing.assert_close(proc(Latent(u.roll(4, dims=3), grid=grid))[0].tokens, out.roll(4, dims=3))


@pytest.mark.parametrize("kind, shift", [("cnn", 3), ("unet", 16)])
def test_conv_processors_equivariant_along_rolled_dim(kind: str, shift: int) -> None:
    grid = Grid([0.0, 0.0], [1.0, 1.0], [20, 32], roll=[False, True])
    proc = build("processor", kind, grid=grid, dim=8, **({"channels": (8, 8, 8, 8, 8)} if kind == "unet" else {}))
    u = torch.randn(1, 20, 32, 8)
    out = proc(Latent(u, grid=grid))[0].tokens
    rolled = proc(Latent(u.roll(shift, dims=2), grid=grid))[0].tokens
    torch.testing.assert_close(rolled, out.roll(shift, dims=2), atol=1e-5, rtol=1e-4)


def test_processor_errors_are_actionable() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        UNetProcessor(Grid([0.0], [1.0], [40], roll=[True]))
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        CNNProcessor(Grid([0.0], [1.0], [8]), kernel_size=4)
    with pytest.raises(ValueError, match="1-, 2- or 3-D"):
        CNNProcessor(Grid([0.0] * 4, [1.0] * 4, [2] * 4))
    proc = CNNProcessor(Grid([0.0], [1.0], [8]), dim=4)
    with pytest.raises(ValueError, match="grid shape"):
        proc(Latent(torch.randn(1, 9, 4)))


def test_convcnp_2d_parameter_count_and_pipeline() -> None:
    """2-D ConvCNP on 32 x 32 (identity encoder, dim 128): the gridded TNP paper reports ~2.1 M parameters."""
    grid = Grid([-2.0, -2.0], [2.0, 2.0], [32, 32])
    shared = {"dim": 128, "dim_x": 2, "dim_y": 1, "grid": grid, "in_dim": 1}
    parts = {
        "grid_encoder": build_from_spec("grid_encoder", "kernel_interpolation", **shared),
        "processor": build_from_spec("processor", "unet", **shared),
        "grid_decoder": build_from_spec("grid_decoder", {"name": "kernel_interpolation", "layers": 1}, **shared),
        "likelihood": build_from_spec("likelihood", "gaussian", **shared),
    }
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
    total = sum(counts.values())
    print("ConvCNP 2-D 32x32 parameters:", counts, "total", total)
    assert 2_000_000 <= total <= 2_200_000
    t = random_tokens(2, 50, 1, grid, valid=[50, 20])
    xt = torch.rand(2, 30, 2) * 4 - 2
    states = parts["processor"](parts["grid_encoder"]({"p": t}))
    dist = parts["likelihood"](parts["grid_decoder"](states, torch.zeros(2, 30, 128), xt))
    assert dist.mean.shape == (2, 30, 1)
    loss = -dist.log_prob(torch.randn(2, 30, 1)).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert parts["grid_encoder"].log_lengthscale.grad.abs().sum() > 0
    assert parts["grid_decoder"].log_lengthscale.grad.abs().sum() > 0


def test_encoder_under_bf16_autocast_matches_float32() -> None:
    enc = KernelInterpolationEncoder(GRID_2D, in_dim=2, dim=4)
    t = random_tokens(2, 40, 2, GRID_2D, valid=[40, 13])
    ref = enc({"p": t}).tokens
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = enc({"p": t}).tokens
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.02)  # only the final Linear runs in bf16


def test_max_pool_unet_matches_a_direct_computation() -> None:
    """downsampling max_pool: ReLU-conv blocks, 2x max-pool (floor), linear upsampling, concatenated skips."""
    import torch.nn.functional as F

    grid = Grid([0.0, 0.0], [1.0, 1.0], [13, 18])
    proc = UNetProcessor(grid, dim=5, channels=(4, 6, 3), kernel_size=3, downsampling="max_pool")
    u = torch.randn(2, 13, 18, 5)

    def block(conv: GridConv, h: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.relu(h), conv.conv.weight, conv.conv.bias, padding=1)

    h0 = (u @ proc.inp.weight.T + proc.inp.bias).permute(0, 3, 1, 2)  # [2, 4, 13, 18]
    s0 = block(proc.down[0], h0)  # [2, 6, 13, 18]
    s1 = block(proc.down[1], F.max_pool2d(s0, 2))  # [2, 3, 6, 9]
    b = block(proc.bottleneck, F.max_pool2d(s1, 2))  # [2, 3, 3, 4]
    up1 = block(proc.up[1], torch.cat([F.interpolate(b, (6, 9), mode="bilinear", align_corners=True), s1], 1))
    up0 = block(proc.up[0], torch.cat([F.interpolate(up1, (13, 18), mode="bilinear", align_corners=True), s0], 1))
    want = up0.permute(0, 2, 3, 1) @ proc.out.weight.T + proc.out.bias
    torch.testing.assert_close(proc(Latent(u, grid=grid))[0].tokens, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("shape", "kernel_size", "conv_parameters"), [((64, 128), 9, 9_290_368), ((4, 24, 60), 5, 14_336_640)]
)
def test_max_pool_unet_has_the_authors_parameter_counts(
    shape: tuple[int, ...], kernel_size: int, conv_parameters: int
) -> None:
    """Five blocks of 128 channels, two poolings: the gridded TNP paper's ERA5 ConvCNP U-Nets (2-D and 3-D)."""
    grid = Grid([0.0] * len(shape), [1.0] * len(shape), shape)
    with torch.device("meta"):
        proc = UNetProcessor(grid, dim=128, channels=(128, 128, 128), kernel_size=kernel_size, downsampling="max_pool")
    convs = [proc.bottleneck, *proc.down, *proc.up]
    assert len(convs) == 5
    assert sum(p.numel() for m in convs for p in m.parameters()) == conv_parameters


def test_max_pool_unet_runs_on_rolled_and_3d_grids() -> None:
    """Shapes kept; not exactly shift-equivariant (``align_corners`` upsampling, as the authors')."""
    grid = Grid([0.0, 0.0], [1.0, 1.0], [10, 16], roll=[False, True])
    proc = UNetProcessor(grid, dim=4, channels=(4, 4, 4), kernel_size=3, downsampling="max_pool")
    assert proc(Latent(torch.randn(1, 10, 16, 4), grid=grid))[0].tokens.shape == (1, 10, 16, 4)
    grid3 = Grid([0.0] * 3, [1.0] * 3, [4, 6, 9])
    proc3 = UNetProcessor(grid3, dim=4, channels=(4, 4, 4), kernel_size=3, downsampling="max_pool")
    assert proc3(Latent(torch.randn(2, 4, 6, 9, 4), grid=grid3))[0].tokens.shape == (2, 4, 6, 9, 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        UNetProcessor(Grid([0.0], [1.0], [18], roll=[True]), channels=(4, 4, 4), downsampling="max_pool")


def test_max_pool_unet_errors_are_actionable() -> None:
    with pytest.raises(ValueError, match="downsampling must be one of strided, max_pool"):
        UNetProcessor(Grid([0.0], [1.0], [16]), downsampling="avg_pool")
    with pytest.raises(ValueError, match="needs >= 4"):
        UNetProcessor(Grid([0.0, 0.0], [1.0, 1.0], [3, 8]), channels=(4, 4, 4), downsampling="max_pool")
