"""Averaging grid encoder: the mean of the context tokens in each grid cell."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gridtnp.nn.grids import (
    Grid,
    assign_cells,
    target_grid,
)
from gridtnp.nn.tokens import Latent, Tokens, check_width, concat_sources
from gridtnp.registry import register


@register("grid_encoder", "average")
class AverageGridEncoder(nn.Module):
    """Avg-GE: the mean of the context tokens whose nearest grid location is each cell, then Linear to ``dim``.

    Empty cells get a learned ``empty`` token (initialised to zeros) instead of the mean of nothing.
    ``[B, N, in_dim]`` -> ``Latent([B, M1..Md, dim])``.

    Args:
        grid: the model's grid (passed by the model); one token per point of it (or of its coarsened grid).
        dim: token width D of the grid tokens.
        in_dim: width of the context tokens (a Linear maps the means to ``dim`` when it differs); null for ``dim``.
        coarsen: block size in points, an int or one per dimension: encode onto the block centres; null: no coarsening.
        learned_tokens: add a learned token per grid location to every cell's output (the gridded TNP paper's Avg-GE
            parameter counts grow by ``dim`` per grid point, so its averages are added to per-location tokens).
    """

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        in_dim: int | None = None,
        coarsen: int | Sequence[int] | None = None,
        learned_tokens: bool = False,
    ) -> None:
        super().__init__()
        self.grid = target_grid(grid, coarsen, "average")
        self.in_dim = dim if in_dim is None else in_dim
        self.proj = nn.Identity() if self.in_dim == dim else nn.Linear(self.in_dim, dim)
        self.empty = nn.Parameter(torch.zeros(dim))
        self.tokens = nn.Parameter(torch.randn(*self.grid.shape, dim) * 0.02) if learned_tokens else None

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        t = concat_sources(sources)
        check_width(t, self.in_dim, "average")
        b, m = t.z.shape[0], self.grid.num_points
        cell, valid = assign_cells(self.grid, t.x, t.mask, 1)
        bucket = (torch.arange(b, device=cell.device).view(b, 1) * m + cell[..., 0]).flatten()
        # Sums over many points: at least float32 even when the tokens are bf16.
        dtype = torch.promote_types(t.z.dtype, torch.float32)
        w = valid[..., 0].flatten().to(dtype)
        z = torch.where(t.mask.unsqueeze(-1), t.z, 0.0).flatten(0, 1).to(dtype)  # padded values may be NaN
        sums = z.new_zeros(b * m, z.shape[-1]).index_add(0, bucket, z)  # z is already 0 where w is
        counts = w.new_zeros(b * m).index_add(0, bucket, w).unsqueeze(-1)
        out = self.proj(sums / counts.clamp(min=1.0))
        out = torch.where(counts > 0, out, self.empty.to(out.dtype)).reshape(b, *self.grid.shape, out.shape[-1])
        if self.tokens is not None:
            out = out + self.tokens.to(out.dtype)
        return Latent(out, grid=self.grid)
