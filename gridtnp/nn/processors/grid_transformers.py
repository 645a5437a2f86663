"""Grid transformers of the gridded TNP paper (Ashman et al., 2024): ``swin`` and ``vit``.

Interface: ``processor(Latent([B, M1..Md, D], grid=...)) -> list[Latent]``, one state per layer (``num_states``)
so that a k-NN decoder refreshes the targets after every layer. ``vit`` with ``patch`` returns states on the coarse
grid of patch centres (``Latent.grid``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import SelfAttentionBlock
from gridtnp.nn.grids import Grid
from gridtnp.nn.processors.checks import check_grid_tokens, check_layers, check_multiple, per_dim
from gridtnp.nn.processors.convolutional import channels_first, channels_last, conv_class
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


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

    Args:
        grid: the grid of the tokens (passed by the model: the grid encoder's).
        dim: token width D.
        layers: number of layers, each a window and a shifted-window pass (one state each); >= 1.
        window: window size in grid points, one int or one per dimension; every grid size must be a multiple of it.
        shift: second-pass shift in grid points, an int or one per dimension, in ``[0, window)``; null: ``window // 2``.
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        roll_dims: one bool per grid dimension, true where shifted windows wrap unmasked; null for the grid's roll.
        share_weights: one block for both passes of a layer (the paper's); false gives each pass its own block.
        patch: patch coarsening first (the {On, Off}-the-grid thesis's PC + Swin): a strided convolution pools
            ``patch`` points per dimension and the windows tile the coarse grid of patch centres; null: none.
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
        patch: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        check_layers("swin", layers)
        self.embed = None
        if patch is not None:
            self.embed, grid = patch_embedding("swin", grid, dim, patch)
        self.grid = grid
        self.window = per_dim("swin", "window", window, grid.ndim)
        if shift is None:
            self.shift = tuple(w // 2 for w in self.window)
        else:
            self.shift = per_dim("swin", "shift", shift, grid.ndim)
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
        check_multiple("swin", "window", grid.shape, self.window)
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
            check_multiple("swin", "window", sizes, self.window)
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
        if self.embed is not None and latent.mask is None:
            tokens = channels_last(self.embed(channels_first(tokens)))
            latent = Latent(tokens, grid=self.grid)
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


def patch_embedding(name: str, grid: Grid, dim: int, patch: int | Sequence[int]) -> tuple[nn.Module, Grid]:
    """A strided convolution (kernel = stride = ``patch``) pooling non-overlapping patches, and the coarse grid of
    the patch centres (thesis: patch coarsening; ViT: patch embedding)."""
    sizes = per_dim(name, "patch", patch, grid.ndim)
    if min(sizes) < 1:
        raise ValueError(f"processor {name!r}: patch sizes must be >= 1; got {list(sizes)}.")
    check_multiple(name, "patch", grid.shape, sizes)
    for d, (size, p, rolled) in enumerate(zip(grid.shape, sizes, grid.roll, strict=True)):
        if not rolled and size // p < 2:
            raise ValueError(
                f"processor {name!r}: patch {p} leaves {size // p} point along ordinary grid dimension {d} "
                f"({size} points); a coarse grid needs >= 2 there. Use a patch <= {size // 2}."
            )
    return conv_class(name, grid)(dim, dim, kernel_size=sizes, stride=sizes), _coarse_grid(grid, sizes)


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

    Args:
        grid: the grid of the tokens (passed by the model: the grid encoder's); 1-, 2- or 3-D with ``patch``.
        dim: token width D.
        layers: number of MHSA + MLP blocks (one state each); >= 1.
        patch: patch size in grid points, one int or one per dimension, dividing the grid; null for no patches.
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
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
        check_layers("vit", layers)
        self.grid, self.embed, self.coarse = grid, None, grid
        if patch is not None:
            self.embed, self.coarse = patch_embedding("vit", grid, dim, patch)
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        check_grid_tokens("vit", self.grid, latent.tokens)
        if self.embed is None:
            z, out = latent.tokens, latent
        else:
            z = channels_last(self.embed(channels_first(latent.tokens)))
            out = Latent(z, grid=self.coarse)
        shape = z.shape
        z = z.reshape(shape[0], -1, shape[-1])
        states = []
        for block in self.blocks:
            z = block(z)
            states.append(out.with_tokens(z.reshape(shape)))
        return states
