"""Processors: update the pseudo-tokens ``Latent`` and return one state per layer.

Every processor returns ``list[Latent]`` (``num_states`` entries, same layout as its output) so a
TNP-style decoder can refresh the targets after each layer (TNP eq. 9); decoders that read only
the final state use the last entry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, SelfAttentionBlock, masked_mean
from gridtnp.nn.grids import Grid
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


def _check_layers(name: str, layers: int) -> None:
    if layers < 1:
        raise ValueError(f"processor {name!r}: layers must be >= 1; got {layers}.")


@register("processor", "transformer")
class TransformerProcessor(nn.Module):
    """Full MHSA over all pseudo-tokens (a set ``[B, N, D]`` with mask, or a flattened grid), ``layers`` blocks."""

    def __init__(self, dim: int = 128, layers: int = 5, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        _check_layers("transformer", layers)
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        z, mask = latent.flat()
        states = []
        for block in self.blocks:
            z = block(z, mask)
            states.append(latent.with_tokens(z.reshape(latent.tokens.shape)))
        return states


@register("processor", "mean")
class MeanProcessor(nn.Module):
    """Deep-set aggregation (CNP): masked mean of the tokens -> one token ``[B, 1, D]``; zeros if empty."""

    num_states = 1

    def forward(self, latent: Latent) -> list[Latent]:
        z, mask = latent.flat()
        return [Latent(masked_mean(z, mask).unsqueeze(1))]


class _PseudoTokens(nn.Module):
    """Shared part of the pseudo-token processors: ``M`` learned initial pseudo-tokens ``[M, D]``."""

    def __init__(self, dim: int, num_tokens: int) -> None:
        super().__init__()
        if num_tokens < 1:
            raise ValueError(f"pseudo-token processor: num_tokens must be >= 1; got {num_tokens}.")
        self.pseudo_tokens = nn.Parameter(torch.randn(num_tokens, dim) * dim**-0.5)

    def initial(self, batch_size: int, dtype: torch.dtype) -> torch.Tensor:
        return self.pseudo_tokens.to(dtype).expand(batch_size, -1, -1)


@register("processor", "ist")
class InducedSetProcessor(_PseudoTokens):
    """PT-TNP, induced-set-transformer style: per layer U <- MHCA(U; Zc), Zc <- MHCA(Zc; U); states are U."""

    def __init__(
        self,
        dim: int = 128,
        num_tokens: int = 128,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
    ) -> None:
        super().__init__(dim, num_tokens)
        _check_layers("ist", layers)
        self.to_pseudo = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.to_context = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        zc, mask = latent.flat()
        u = self.initial(zc.shape[0], zc.dtype)
        states = []
        for to_pseudo, to_context in zip(self.to_pseudo, self.to_context, strict=True):
            u = to_pseudo(u, zc, mask)
            zc = to_context(zc, u)
            states.append(Latent(u))
        return states


@register("processor", "perceiver")
class PerceiverProcessor(_PseudoTokens):
    """PT-TNP, perceiver / LBANP style: per layer U <- MHCA(U; Zc) then U <- MHSA(U); states are U."""

    def __init__(
        self,
        dim: int = 128,
        num_tokens: int = 128,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
    ) -> None:
        super().__init__(dim, num_tokens)
        _check_layers("perceiver", layers)
        self.cross = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.self_attn = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        zc, mask = latent.flat()
        u = self.initial(zc.shape[0], zc.dtype)
        states = []
        for cross, self_attn in zip(self.cross, self.self_attn, strict=True):
            u = self_attn(cross(u, zc, mask))
            states.append(Latent(u))
        return states


# --- Convolutional processors (ConvCNP) -------------------------------------------------------------------------
# Convolutions run channels-first on [B, C, M1..Md] with explicit padding, so each grid dimension can be padded
# its own way: wrap-around along rolled (periodic) dimensions, zeros elsewhere. torch's padding_mode is one mode
# for all dimensions, hence padding=0 in the conv modules and _pad_grid in front of them.


def _conv_class(name: str, grid: Grid, transpose: bool = False) -> type[nn.Module]:
    if not 1 <= grid.ndim <= 3:
        raise ValueError(f"processor {name!r} supports 1-, 2- or 3-D grids; got a {grid.ndim}-D grid {grid}.")
    return getattr(nn, f"Conv{'Transpose' if transpose else ''}{grid.ndim}d")


def _check_kernel(name: str, kernel_size: int, minimum: int = 1) -> None:
    if kernel_size < minimum or kernel_size % 2 == 0:
        raise ValueError(
            f"processor {name!r}: kernel_size must be odd and >= {minimum} (for 'same' padding); got {kernel_size}."
        )


def _pad_grid(x: Tensor, pad: int, roll: Sequence[bool]) -> Tensor:
    """Pad ``x [B, C, M1..Md]`` by ``pad`` cells on both sides of every grid dim: wrapped if rolled, else zeros."""
    if pad == 0:
        return x
    for d, rolled in enumerate(roll):  # loop over grid dimensions (d <= 3)
        if rolled:
            size = x.shape[2 + d]
            x = x.index_select(2 + d, torch.arange(-pad, size + pad, device=x.device) % size)
    if not all(roll):
        x = F.pad(x, [p for rolled in reversed(roll) for p in ((0, 0) if rolled else (pad, pad))])
    return x


class _GridConv(nn.Module):
    """'Same'-padded convolution on ``[B, C, M1..Md]`` (stride 2 gives ``ceil(M / 2)``); wraps rolled dims."""

    def __init__(
        self, name: str, grid: Grid, c_in: int, c_out: int, kernel_size: int, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.roll, self.pad = grid.roll, kernel_size // 2
        self.conv = _conv_class(name, grid)(c_in, c_out, kernel_size, stride=stride, groups=groups)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(_pad_grid(x, self.pad, self.roll))


class _GridConvTranspose(nn.Module):
    """Stride-2 transposed convolution ``[B, C, M1..Md] -> [B, C', 2 M1..2 Md]``; wraps rolled dims.

    Equals ``ConvTransposeNd(padding=k // 2, output_padding=1)`` along zero-padded dims: the input is padded by
    ``q = ceil(p / 2)`` cells (enough for every output cell to see all its inputs), the conv runs unpadded, and
    output cells ``[2q + p, 2q + p + 2M)`` are kept.
    """

    def __init__(self, name: str, grid: Grid, c_in: int, c_out: int, kernel_size: int) -> None:
        super().__init__()
        self.roll, self.p = grid.roll, kernel_size // 2
        self.q = (self.p + 1) // 2
        self.conv = _conv_class(name, grid, transpose=True)(c_in, c_out, kernel_size, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        sizes = x.shape[2:]
        out = self.conv(_pad_grid(x, self.q, self.roll))
        start = 2 * self.q + self.p
        for d, size in enumerate(sizes):  # loop over grid dimensions (d <= 3)
            out = out.narrow(2 + d, start, 2 * size)
        return out


def _channels_first(tokens: Tensor) -> Tensor:
    """``[B, M1..Md, C] -> [B, C, M1..Md]``."""
    return tokens.movedim(-1, 1)


def _channels_last(x: Tensor) -> Tensor:
    """``[B, C, M1..Md] -> [B, M1..Md, C]``."""
    return x.movedim(1, -1)


def _check_grid_tokens(name: str, grid: Grid, tokens: Tensor) -> None:
    if tuple(tokens.shape[1:-1]) != grid.shape:
        raise ValueError(
            f"processor {name!r} was built for grid shape {list(grid.shape)} but got tokens {tuple(tokens.shape)}; "
            f"expected [B, {', '.join(map(str, grid.shape))}, D] from a grid encoder on the same grid."
        )


@register("processor", "cnn")
class CNNProcessor(nn.Module):
    """Residual CNN on grid tokens ``[B, M1..Md, dim]``: Linear -> ``layers`` x (conv, ReLU, 1x1 conv) + skip -> Linear.

    Each block is depthwise-separable when ``separable`` (a ``kernel_size`` depthwise conv then a pointwise
    conv), else a full ``kernel_size`` conv then a pointwise conv. 'Same' padding keeps the grid shape;
    rolled dimensions are padded circularly.
    """

    num_states = 1

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        channels: int = 128,
        layers: int = 4,
        kernel_size: int = 5,
        separable: bool = True,
    ) -> None:
        super().__init__()
        _check_layers("cnn", layers)
        _check_kernel("cnn", kernel_size)
        self.grid = grid
        self.inp = nn.Linear(dim, channels)
        self.spatial = nn.ModuleList(
            _GridConv("cnn", grid, channels, channels, kernel_size, groups=channels if separable else 1)
            for _ in range(layers)
        )
        self.pointwise = nn.ModuleList(nn.Linear(channels, channels) for _ in range(layers))
        self.out = nn.Linear(channels, dim)

    def forward(self, latent: Latent) -> list[Latent]:
        _check_grid_tokens("cnn", self.grid, latent.tokens)
        h = self.inp(latent.tokens)
        for spatial, pointwise in zip(self.spatial, self.pointwise, strict=True):
            h = h + pointwise(F.relu(_channels_last(spatial(_channels_first(h)))))
        return [latent.with_tokens(self.out(h))]


@register("processor", "unet")
class UNetProcessor(nn.Module):
    """U-Net on grid tokens ``[B, M1..Md, dim]``: strided convs down, transposed convs up, skip concatenations.

    ``channels = (c_0, ..., c_L)``: Linear ``dim -> c_0``; level ``l`` halves the grid with a stride-2
    ``kernel_size`` conv ``c_{l-1} -> c_l`` (+ ReLU); going up, a stride-2 transposed conv maps level ``l`` to
    ``c_{l-1}`` channels (+ ReLU), concatenated with the skip from level ``l-1`` (so ``2 c_{l-1}`` channels
    enter the next transposed conv); a final Linear ``2 c_0 -> dim``. The layout follows the ConvCNP U-Net
    (Gordon et al., 2020), in N-d.

    Defaults, ``channels = (64, 64, 64, 128, 128)`` and ``kernel_size = 5`` (4 downsamplings, so a 32 x 32
    grid reaches 2 x 2): 2,073,472 U-Net parameters in 2-D; a 2-D ConvCNP with ``dim = 128`` (kernel-
    interpolation encoder with ``in_dim = 1`` and decoder, Gaussian head) totals 2,107,142, the gridded TNP
    paper's ~2.1 M. In 1-D the same U-Net has 435,072 parameters.

    Grid sizes: each ordinary dimension is zero-padded at its end to a multiple of ``2^L`` and cropped back;
    a rolled dimension must itself be a multiple of ``2^L`` (padding would break its periodicity).
    """

    num_states = 1

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        channels: Sequence[int] = (64, 64, 64, 128, 128),
        kernel_size: int = 5,
    ) -> None:
        super().__init__()
        channels = [int(c) for c in channels]
        if len(channels) < 2 or min(channels) < 1:
            raise ValueError(
                f"processor 'unet': channels must list >= 2 positive widths (the top level, then one per "
                f"downsampling); got {channels}."
            )
        _check_kernel("unet", kernel_size, minimum=3)
        self.grid, self.levels = grid, len(channels) - 1
        factor = 2**self.levels
        for d, (size, rolled) in enumerate(zip(grid.shape, grid.roll, strict=True)):
            if rolled and size % factor:
                lower, upper = size // factor * factor, math.ceil(size / factor) * factor
                raise ValueError(
                    f"processor 'unet': rolled grid dimension {d} has {size} points, but with {self.levels} "
                    f"downsamplings (channels={channels}) a rolled dimension must be a multiple of {factor} "
                    f"(e.g. {', '.join(str(s) for s in (lower, upper) if s > 0)}); change the grid shape or use "
                    f"fewer channel levels."
                )
        self.inp = nn.Linear(dim, channels[0])
        self.down = nn.ModuleList(
            _GridConv("unet", grid, channels[i], channels[i + 1], kernel_size, stride=2) for i in range(self.levels)
        )
        # The deepest transposed conv sees only the bottom features; the others also their level's skip.
        up_in = [c * (1 if i == self.levels - 1 else 2) for i, c in enumerate(channels[1:])]
        self.up = nn.ModuleList(
            _GridConvTranspose("unet", grid, up_in[i], channels[i], kernel_size) for i in range(self.levels)
        )
        self.out = nn.Linear(2 * channels[0], dim)
        self.padding = [0 if rolled else -size % factor for size, rolled in zip(grid.shape, grid.roll, strict=True)]

    def forward(self, latent: Latent) -> list[Latent]:
        _check_grid_tokens("unet", self.grid, latent.tokens)
        h = _channels_first(self.inp(latent.tokens))
        if any(self.padding):
            h = F.pad(h, [p for pad in reversed(self.padding) for p in (0, pad)])
        skips = [h]
        for down in self.down:
            skips.append(F.relu(down(skips[-1])))
        h = skips.pop()
        for i in reversed(range(self.levels)):
            h = torch.cat([F.relu(self.up[i](h)), skips.pop()], dim=1)
        for d, size in enumerate(self.grid.shape):  # crop the end padding; loop over grid dimensions (d <= 3)
            h = h.narrow(2 + d, 0, size)
        return [latent.with_tokens(self.out(_channels_last(h)))]


# --- Grid transformers (gridded TNP, Ashman et al. 2024) -------------------------------------------------------------


def _per_dim(name: str, key: str, value: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """One int per grid dimension from an int or a list of ``ndim`` ints."""
    values = (int(value),) * ndim if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != ndim:
        raise ValueError(
            f"processor {name!r}: {key} must be one int or {ndim} ints (one per grid dimension); got {value!r}."
        )
    return values


def _check_multiple(name: str, key: str, shape: Sequence[int], factor: Sequence[int]) -> None:
    """Raise if a grid size is not a multiple of ``factor`` along some dimension, naming the allowed sizes."""
    for d, (size, f) in enumerate(zip(shape, factor, strict=True)):
        if size % f:
            near = sorted({max(f, size // f * f), math.ceil(size / f) * f})
            raise ValueError(
                f"processor {name!r}: grid dimension {d} has {size} points, which is not a multiple of the {key} "
                f"{f} along it; allowed sizes are multiples of {f} (e.g. {' or '.join(map(str, near))}). Change "
                f"the grid shape or the {key}."
            )


def _to_windows(z: Tensor, window: Sequence[int]) -> Tensor:
    """``[B, M1..Md, D] -> [B * nW, prod(window), D]``: windows become the batch (row-major within and across)."""
    b, *sizes, c = z.shape
    d = len(window)
    split = [n for size, w in zip(sizes, window, strict=True) for n in (size // w, w)]
    z = z.reshape(b, *split, c)  # [B, n1, w1, ..., nd, wd, D]
    z = z.permute(0, *range(1, 2 * d, 2), *range(2, 2 * d + 1, 2), 2 * d + 1)  # [B, n1..nd, w1..wd, D]
    return z.reshape(-1, math.prod(window), c)


class _WindowPlan(NamedTuple):
    """Index plan of one grid shape: flat gathers ``[M]`` between layouts, applied shift, shifted-window mask."""

    grid_to_regular: Tensor  # regular-window layout <- grid (row-major)
    regular_to_shifted: Tensor  # shifted-window layout <- regular-window layout
    shifted_to_grid: Tensor  # grid <- shifted-window layout
    shift: tuple[int, ...]
    mask: Tensor | None  # [nW, N, N], True = attend; None where nothing needs masking


@register("processor", "swin")
class SwinProcessor(nn.Module):
    """Swin transformer on grid tokens ``[B, M1..Md, D]`` (any d): per layer, MHSA in windows, then in shifted windows.

    Follows the Swin-TNP of the gridded TNP paper (Ashman et al., 2024): each of the ``layers`` layers is two
    pre-norm MHSA + MLP passes (one shared block unless ``share_weights=False``), the first within
    non-overlapping windows of ``window`` points per dimension, the second within windows shifted by ``shift``
    (default ``window // 2``), i.e. windows of the grid cyclically rolled
    by ``-shift`` (Swin, Liu et al. 2021, Sec. 3.2). After the roll, a window at the end of an ordinary dimension
    holds tokens from both ends of the grid; attention between them is masked (Swin's region mask). Along rolled
    (periodic) dimensions, ``roll_dims`` (default ``grid.roll``), the wrap is true adjacency and nothing is masked.
    Where one window covers a whole dimension no shift is applied along it (as in Swin). One state per layer
    (``num_states = layers``).

    Every grid size must be a multiple of the window along its dimension (no padding: padded tokens would break
    the periodicity of rolled dimensions and the uniform windows). The roll and window partition are one cached
    flat gather per layout change; gathers and masks are built once per grid shape and device. Paper defaults:
    5 layers, window 4 and shift 2 per dimension.
    """

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        layers: int = 5,
        window: int | Sequence[int] = 4,
        shift: int | Sequence[int] | None = None,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        roll_dims: Sequence[bool] | None = None,
        share_weights: bool = True,
    ) -> None:
        super().__init__()
        _check_layers("swin", layers)
        self.grid = grid
        self.window = _per_dim("swin", "window", window, grid.ndim)
        if shift is None:
            self.shift = tuple(w // 2 for w in self.window)
        else:
            self.shift = _per_dim("swin", "shift", shift, grid.ndim)
        self.roll_dims = tuple(bool(r) for r in (grid.roll if roll_dims is None else roll_dims))
        if len(self.roll_dims) != grid.ndim:
            raise ValueError(
                f"processor 'swin': roll_dims must have one bool per grid dimension ({grid.ndim}); got {roll_dims!r}."
            )
        if min(self.window) < 1:
            raise ValueError(f"processor 'swin': window sizes must be >= 1; got {list(self.window)}.")
        for d, (s, w) in enumerate(zip(self.shift, self.window, strict=True)):
            if not 0 <= s < w:
                raise ValueError(
                    f"processor 'swin': shift along dimension {d} must be in [0, window) = [0, {w}); got {s}."
                )
        _check_multiple("swin", "window", grid.shape, self.window)
        # The paper's Swin layer applies one MHSA block to the regular and then the shifted windows (10 MHSA
        # passes from 5 weight sets, ~1.3 M parameters for Swin-TNP PT-GE at 32 x 32); share_weights=False gives
        # each pass its own block, as in the original Swin.
        num_blocks = layers if share_weights else 2 * layers
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(num_blocks))
        self.share_weights = share_weights
        self.num_states = layers
        # (grid shape, device) -> plan; a dict rather than buffers, so it is not saved and any valid shape works.
        self._plans: dict[tuple[tuple[int, ...], torch.device], _WindowPlan] = {}

    def plan(self, sizes: Sequence[int], device: torch.device) -> _WindowPlan:
        """The gathers, applied shift and shifted-window mask for grid ``sizes`` on ``device``, built once."""
        key = (tuple(sizes), torch.device(device))
        if key not in self._plans:
            _check_multiple("swin", "window", sizes, self.window)
            shift = tuple(0 if w == size else s for s, w, size in zip(self.shift, self.window, sizes, strict=True))
            dims = tuple(range(len(sizes)))
            index = torch.arange(math.prod(sizes), device=device).reshape(sizes)
            regular = _to_windows(index[None, ..., None], self.window).flatten()  # grid index of each slot
            shifted = _to_windows(index.roll([-s for s in shift], dims)[None, ..., None], self.window).flatten()
            # Along an ordinary dimension the tokens with index < shift came round from the far border: give each
            # side of the border its own region bit and let only tokens of one region attend to each other.
            region = torch.zeros(sizes, dtype=torch.long, device=device)
            for d, (size, s, rolled) in enumerate(zip(sizes, shift, self.roll_dims, strict=True)):  # d <= 3
                if s and not rolled:
                    wrapped = (torch.arange(size, device=device) < s).long() << d
                    region = region + wrapped.view(size, *([1] * (len(sizes) - d - 1)))
            mask = None
            if region.any():
                ids = region.flatten()[shifted].view(-1, math.prod(self.window))  # [nW, N]
                mask = ids[:, :, None] == ids[:, None, :]
            self._plans[key] = _WindowPlan(
                regular, torch.argsort(regular)[shifted], torch.argsort(shifted), shift, mask
            )
        return self._plans[key]

    def forward(self, latent: Latent) -> list[Latent]:
        tokens = latent.tokens
        if latent.mask is not None or tokens.dim() != self.grid.ndim + 2:
            raise ValueError(
                f"processor 'swin' needs grid tokens [B, M1..M{self.grid.ndim}, D] from a grid encoder; got "
                f"{tuple(tokens.shape)}{' with a set mask' if latent.mask is not None else ''}."
            )
        b, *sizes, c = tokens.shape
        plan = self.plan(sizes, tokens.device)
        n = math.prod(self.window)
        mask = plan.mask
        # One [B * nW, N, N] copy per forward, shared by every shifted block (a stride-0 batch expansion cannot be
        # merged with the window axis into one batch axis).
        if mask is not None:
            mask = mask.expand(b, *mask.shape).reshape(-1, n, n)
        z, states = tokens.reshape(b, -1, c), []
        step = 1 if self.share_weights else 2
        for i in range(0, len(self.blocks), step):  # loop over layers
            z = self.blocks[i](z.index_select(1, plan.grid_to_regular).view(-1, n, c)).view(b, -1, c)
            shifted = z.index_select(1, plan.regular_to_shifted).view(-1, n, c)
            z = self.blocks[i + step - 1](shifted, mask).view(b, -1, c)
            z = z.index_select(1, plan.shifted_to_grid)
            states.append(latent.with_tokens(z.view(tokens.shape)))
        return states


def _coarse_grid(grid: Grid, patch: Sequence[int]) -> Grid:
    """The grid of patch centres after non-overlapping ``patch`` pooling of ``grid``."""
    lower, upper = [], []
    for lo, hi, step, p, rolled in zip(grid.lower, grid.upper, grid.spacing, patch, grid.roll, strict=True):
        offset = (p - 1) / 2 * step  # centre of a patch of p cells relative to its first cell
        lower.append(lo + offset)
        upper.append(lo + offset + (hi - lo) if rolled else hi - offset)  # rolled: the period is kept
    return Grid(lower, upper, [m // p for m, p in zip(grid.shape, patch, strict=True)], grid.roll)


@register("processor", "vit")
class ViTProcessor(nn.Module):
    """ViT on grid tokens ``[B, M1..Md, D]``: optional patch embedding to ``[B, M1/p1..Md/pd, D]``, then full MHSA.

    With ``patch`` a strided convolution (kernel = stride = patch) pools non-overlapping patches, as in ViT
    (Dosovitskiy et al., 2021) and the ViT-TNP of the gridded TNP paper; the states then carry the coarse
    ``grid`` whose points are the patch centres (same bounds convention and rolled dimensions), so a k-NN decoder
    indexes it correctly. Without ``patch`` it is ``layers`` MHSA blocks over the flattened grid. One state per
    layer.
    """

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        layers: int = 5,
        patch: int | Sequence[int] | None = None,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
    ) -> None:
        super().__init__()
        _check_layers("vit", layers)
        self.grid, self.patch, self.embed, self.coarse = grid, None, None, grid
        if patch is not None:
            self.patch = _per_dim("vit", "patch", patch, grid.ndim)
            if min(self.patch) < 1:
                raise ValueError(f"processor 'vit': patch sizes must be >= 1; got {list(self.patch)}.")
            _check_multiple("vit", "patch", grid.shape, self.patch)
            for d, (size, p, rolled) in enumerate(zip(grid.shape, self.patch, grid.roll, strict=True)):
                if not rolled and size // p < 2:
                    raise ValueError(
                        f"processor 'vit': patch {p} leaves {size // p} point along ordinary grid dimension {d} "
                        f"({size} points); a coarse grid needs >= 2 there. Use a patch <= {size // 2}."
                    )
            conv = _conv_class("vit", grid)
            self.embed = conv(dim, dim, kernel_size=self.patch, stride=self.patch)
            self.coarse = _coarse_grid(grid, self.patch)
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        _check_grid_tokens("vit", self.grid, latent.tokens)
        if self.embed is None:
            z, out = latent.tokens, latent
        else:
            z = _channels_last(self.embed(_channels_first(latent.tokens)))
            out = Latent(z, grid=self.coarse)
        shape = z.shape
        z = z.reshape(shape[0], -1, shape[-1])
        states = []
        for block in self.blocks:
            z = block(z)
            states.append(out.with_tokens(z.reshape(shape)))
        return states


@register("processor", "identity")
class IdentityProcessor(nn.Module):
    """No processing: the grid encoder's latent is the single state (RCNP, MSA: the decoder does the work)."""

    num_states = 1

    def forward(self, latent: Latent) -> list[Latent]:
        return [latent]
