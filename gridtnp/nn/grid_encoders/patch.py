"""Patch grid encoder: a grid of tokens coarsened by non-overlapping patches (ViT)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from gridtnp.nn.grid_encoders.average import AverageGridEncoder
from gridtnp.nn.grids import Grid, target_grid
from gridtnp.nn.processors.convolutional import channels_first, channels_last, conv_class
from gridtnp.nn.tokens import Latent, Tokens
from gridtnp.registry import register


@register("grid_encoder", "patch")
class PatchGridEncoder(nn.Module):
    """Patch coarsening: tokens averaged onto the fine grid, then a ``patch`` strided convolution to block centres.

    The {On, Off}-the-grid thesis's patch coarsening before grid encoding (in ``multi``, beside a ``pseudo_token``
    with ``coarsen: patch`` for scattered sources). Each token goes to its nearest fine grid location (``average``);
    a convolution with kernel = stride = ``patch`` (the ViT's patch embedding) gives one token per block, at the
    block centres of ``coarsen_grid(grid, patch)``. ``[B, N, in_dim]`` -> ``Latent([B, M1/p1..Md/pd, dim])``.

    Args:
        grid: the model's grid (passed by the model): the fine grid the tokens are placed on.
        dim: token width D of the coarse grid tokens.
        in_dim: width of the context tokens; null for ``dim``.
        patch: block size in fine points, one int or one per dimension, dividing the grid.
    """

    def __init__(self, grid: Grid, dim: int = 128, in_dim: int | None = None, patch: int | Sequence[int] = 2) -> None:
        super().__init__()
        self.grid = target_grid(grid, patch, "patch")
        sizes = (patch,) * grid.ndim if isinstance(patch, int) else tuple(patch)
        self.fine = AverageGridEncoder(grid, dim=dim, in_dim=in_dim)
        self.embed = conv_class("patch", grid)(dim, dim, kernel_size=sizes, stride=sizes)

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        fine = self.fine(sources).tokens  # [B, M1..Md, dim]
        return Latent(channels_last(self.embed(channels_first(fine))), grid=self.grid)
