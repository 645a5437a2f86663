"""Convolutional processors (ConvCNP): ``cnn`` (residual, 1-D default) and ``unet`` on grid tokens.

Interface: ``processor(Latent([B, M1..Md, D], grid=...)) -> [Latent([B, M1..Md, D])]`` (one state).
Convolutions run channels-first on ``[B, C, M1..Md]`` with explicit padding, so each grid dimension can be padded
its own way: wrap-around along rolled (periodic) dimensions, zeros elsewhere. torch's ``padding_mode`` is one mode
for all dimensions, hence ``padding=0`` in the conv modules and ``pad_grid`` in front of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gridtnp.nn.grids import Grid
from gridtnp.nn.processors.checks import check_grid_tokens, check_layers
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


def conv_class(name: str, grid: Grid, transpose: bool = False) -> type[nn.Module]:
    if not 1 <= grid.ndim <= 3:
        raise ValueError(f"processor {name!r} supports 1-, 2- or 3-D grids; got a {grid.ndim}-D grid {grid}.")
    return getattr(nn, f"Conv{'Transpose' if transpose else ''}{grid.ndim}d")


def _check_kernel(name: str, kernel_size: int, minimum: int = 1) -> None:
    if kernel_size < minimum or kernel_size % 2 == 0:
        raise ValueError(
            f"processor {name!r}: kernel_size must be odd and >= {minimum} (for 'same' padding); got {kernel_size}."
        )


def pad_grid(x: Tensor, pad: int, roll: Sequence[bool]) -> Tensor:
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


class GridConv(nn.Module):
    """'Same'-padded convolution on ``[B, C, M1..Md]`` (stride 2 gives ``ceil(M / 2)``); wraps rolled dims."""

    def __init__(
        self, name: str, grid: Grid, c_in: int, c_out: int, kernel_size: int, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.roll, self.pad = grid.roll, kernel_size // 2
        self.conv = conv_class(name, grid)(c_in, c_out, kernel_size, stride=stride, groups=groups)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(pad_grid(x, self.pad, self.roll))


class GridConvTranspose(nn.Module):
    """Stride-2 transposed convolution ``[B, C, M1..Md] -> [B, C', 2 M1..2 Md]``; wraps rolled dims.

    Equals ``ConvTransposeNd(padding=k // 2, output_padding=1)`` along zero-padded dims: the input is padded by
    ``q = ceil(p / 2)`` cells (enough for every output cell to see all its inputs), the conv runs unpadded, and
    output cells ``[2q + p, 2q + p + 2M)`` are kept.
    """

    def __init__(self, name: str, grid: Grid, c_in: int, c_out: int, kernel_size: int) -> None:
        super().__init__()
        self.roll, self.p = grid.roll, kernel_size // 2
        self.q = (self.p + 1) // 2
        self.conv = conv_class(name, grid, transpose=True)(c_in, c_out, kernel_size, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        sizes = x.shape[2:]
        out = self.conv(pad_grid(x, self.q, self.roll))
        start = 2 * self.q + self.p
        for d, size in enumerate(sizes):  # loop over grid dimensions (d <= 3)
            out = out.narrow(2 + d, start, 2 * size)
        return out


def channels_first(tokens: Tensor) -> Tensor:
    """``[B, M1..Md, C] -> [B, C, M1..Md]``."""
    return tokens.movedim(-1, 1)


def channels_last(x: Tensor) -> Tensor:
    """``[B, C, M1..Md] -> [B, M1..Md, C]``."""
    return x.movedim(1, -1)


DOWNSAMPLINGS = ("strided", "max_pool")


@register("processor", "cnn")
class CNNProcessor(nn.Module):
    """Residual CNN on grid tokens ``[B, M1..Md, dim]``: Linear -> ``layers`` x (conv, ReLU, 1x1 conv) + skip -> Linear.

    Each block is depthwise-separable when ``separable`` (a ``kernel_size`` depthwise conv then a pointwise
    conv), else a full ``kernel_size`` conv then a pointwise conv. 'Same' padding keeps the grid shape;
    rolled dimensions are padded circularly. ``residual: false`` makes it a plain CNN, Linear -> ``layers``
    convolutions with a ReLU between each two -> Linear, no pointwise convs or skips (the gridded TNP paper's
    2-D GP ConvCNPs: five layers of C = 128).

    Args:
        grid: the grid of the tokens, 1-, 2- or 3-D (passed by the model: the grid encoder's).
        dim: token width D.
        channels: width of the convolutions (a Linear maps ``dim`` to it in front and back behind).
        layers: number of residual convolution blocks; >= 1.
        kernel_size: kernel width of the spatial convolutions along every grid dimension; odd, >= 1.
        separable: depthwise spatial convolutions (one filter per channel); false for full ones.
        residual: residual blocks (conv, ReLU, 1x1 conv, skip); false: a plain stack of convolutions and ReLUs.
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
        residual: bool = True,
    ) -> None:
        super().__init__()
        check_layers("cnn", layers)
        self.residual = residual
        _check_kernel("cnn", kernel_size)
        self.grid = grid
        self.inp = nn.Linear(dim, channels)
        self.spatial = nn.ModuleList(
            GridConv("cnn", grid, channels, channels, kernel_size, groups=channels if separable else 1)
            for _ in range(layers)
        )
        self.pointwise = nn.ModuleList(nn.Linear(channels, channels) for _ in range(layers if residual else 0))
        self.out = nn.Linear(channels, dim)

    def forward(self, latent: Latent) -> list[Latent]:
        check_grid_tokens("cnn", self.grid, latent.tokens)
        h = self.inp(latent.tokens)
        if not self.residual:  # plain: conv, ReLU, conv, ..., conv
            h = channels_first(h)
            for i, spatial in enumerate(self.spatial):
                h = spatial(h if i == 0 else F.relu(h))
            return [latent.with_tokens(self.out(channels_last(h)))]
        for spatial, pointwise in zip(self.spatial, self.pointwise, strict=True):
            h = h + pointwise(F.relu(channels_last(spatial(channels_first(h)))))
        return [latent.with_tokens(self.out(h))]


@register("processor", "unet")
class UNetProcessor(nn.Module):
    """U-Net on grid tokens ``[B, M1..Md, dim]``: strided convs or max-pooling down (``downsampling``), skip concats.

    ``channels = (c_0, ..., c_L)``, ``L`` levels below the top. Both layouts start with a Linear ``dim -> c_0``.

    ``strided`` (default): level ``l`` halves the grid with a stride-2 ``kernel_size`` conv ``c_{l-1} -> c_l``
    (+ ReLU); going up, a stride-2 transposed conv maps level ``l`` to ``c_{l-1}`` channels (+ ReLU),
    concatenated with the skip from level ``l-1`` (so ``2 c_{l-1}`` channels enter the next transposed conv);
    a final Linear ``2 c_0 -> dim``. The layout follows the ConvCNP U-Net (Gordon et al., 2020), in N-d.
    Defaults, ``channels = (64, 64, 64, 128, 128)`` and ``kernel_size = 5`` (4 downsamplings, so a 32 x 32
    grid reaches 2 x 2): 2,073,472 U-Net parameters in 2-D; a 2-D ConvCNP with ``dim = 128`` (kernel-
    interpolation encoder with ``in_dim = 1`` and decoder, Gaussian head) totals 2,107,142, the gridded TNP
    paper's ~2.1 M. In 1-D the same U-Net has 435,072 parameters.

    ``max_pool`` (the gridded TNP authors' U-Net, ``2 L + 1`` blocks): every block is ReLU then a 'same'
    ``kernel_size`` conv; going down, block ``l`` maps ``c_l -> c_{l+1}``, its output is the skip, and a
    2x max-pool halves the grid (floor); a bottleneck block ``c_L -> c_L``; going up, the features are
    linearly interpolated (``align_corners``) to the skip's grid, concatenated with it and a block maps
    ``2 c_{l+1} -> c_l``; a final Linear ``c_0 -> dim``. ``channels = (128, 128, 128)`` gives 9,290,368
    convolution parameters at kernel 9 in 2-D and 14,336,640 at kernel 5 in 3-D: the paper's ERA5 ConvCNPs.

    Grid sizes: a rolled dimension must be a multiple of ``2^L`` (padding or flooring would break its
    periodicity). ``strided`` zero-pads each ordinary dimension at its end to a multiple of ``2^L`` and crops
    back; ``max_pool`` needs each ordinary dimension to have at least ``2^L`` points.

    Args:
        grid: the grid of the tokens, 1-, 2- or 3-D (passed by the model: the grid encoder's).
        dim: token width D.
        channels: widths ``(c_0, ..., c_L)``: the top level, then one per downsampling; >= 2 positive entries.
        kernel_size: kernel width of the convolutions; odd, >= 3.
        downsampling: ``strided`` (stride-2 and transposed convolutions) or ``max_pool`` (conv blocks, max-pooling
            and linear upsampling).
    """

    num_states = 1

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        channels: Sequence[int] = (64, 64, 64, 128, 128),
        kernel_size: int = 5,
        downsampling: str = "strided",
    ) -> None:
        super().__init__()
        channels = [int(c) for c in channels]
        if len(channels) < 2 or min(channels) < 1:
            raise ValueError(
                f"processor 'unet': channels must list >= 2 positive widths (the top level, then one per "
                f"downsampling); got {channels}."
            )
        if downsampling not in DOWNSAMPLINGS:
            raise ValueError(
                f"processor 'unet': downsampling must be one of {', '.join(DOWNSAMPLINGS)}; got {downsampling!r}."
            )
        _check_kernel("unet", kernel_size, minimum=3)
        self.grid, self.levels, self.pooled = grid, len(channels) - 1, downsampling == "max_pool"
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
            if self.pooled and size < factor:
                raise ValueError(
                    f"processor 'unet': grid dimension {d} has {size} points, too few for {self.levels} 2x "
                    f"max-poolings (channels={channels}); it needs >= {factor}: enlarge the grid or use fewer levels."
                )
        self.inp = nn.Linear(dim, channels[0])
        if self.pooled:
            self.down = nn.ModuleList(
                GridConv("unet", grid, channels[i], channels[i + 1], kernel_size) for i in range(self.levels)
            )
            self.bottleneck = GridConv("unet", grid, channels[-1], channels[-1], kernel_size)
            self.up = nn.ModuleList(
                GridConv("unet", grid, 2 * channels[i + 1], channels[i], kernel_size) for i in range(self.levels)
            )
            self.out = nn.Linear(channels[0], dim)
            self.padding = [0] * grid.ndim
            return
        self.down = nn.ModuleList(
            GridConv("unet", grid, channels[i], channels[i + 1], kernel_size, stride=2) for i in range(self.levels)
        )
        # The deepest transposed conv sees only the bottom features; the others also their level's skip.
        up_in = [c * (1 if i == self.levels - 1 else 2) for i, c in enumerate(channels[1:])]
        self.up = nn.ModuleList(
            GridConvTranspose("unet", grid, up_in[i], channels[i], kernel_size) for i in range(self.levels)
        )
        self.out = nn.Linear(2 * channels[0], dim)
        self.padding = [0 if rolled else -size % factor for size, rolled in zip(grid.shape, grid.roll, strict=True)]

    def forward(self, latent: Latent) -> list[Latent]:
        check_grid_tokens("unet", self.grid, latent.tokens)
        h = channels_first(self.inp(latent.tokens))
        h = self._pooled(h) if self.pooled else self._strided(h)
        return [latent.with_tokens(self.out(channels_last(h)))]

    def _strided(self, h: Tensor) -> Tensor:
        """``[B, c_0, M1..Md] -> [B, 2 c_0, M1..Md]``: stride-2 convs down, transposed convs up."""
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
        return h

    def _pooled(self, h: Tensor) -> Tensor:
        """``[B, c_0, M1..Md] -> [B, c_0, M1..Md]``: pre-activation conv blocks, max-pool down, interpolate up."""
        pool = getattr(F, f"max_pool{self.grid.ndim}d")
        mode = ("linear", "bilinear", "trilinear")[self.grid.ndim - 1]
        skips = []
        for down in self.down:
            skips.append(down(F.relu(h)))
            h = pool(skips[-1], 2)
        h = self.bottleneck(F.relu(h))
        for i in reversed(range(self.levels)):
            skip = skips.pop()
            h = F.interpolate(h, size=skip.shape[2:], mode=mode, align_corners=True)
            h = self.up[i](F.relu(torch.cat([h, skip], dim=1)))
        return h
