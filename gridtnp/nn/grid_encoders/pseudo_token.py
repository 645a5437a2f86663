"""Pseudo-token grid encoder (PT-GE): each grid cell's pseudo-token attends to the context tokens in it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gridtnp.nn.attention import CrossAttentionBlock
from gridtnp.nn.grids import (
    Grid,
    assign_cells,
    grid_coordinates,
    target_grid,
)
from gridtnp.nn.mlp import mlp
from gridtnp.nn.single_query import segment_attention
from gridtnp.nn.tokens import Latent, Tokens, check_width, concat_sources, zero_padding
from gridtnp.registry import register


@register("grid_encoder", "pseudo_token")
class PseudoTokenGridEncoder(nn.Module):
    """PT-GE: a learned pseudo-token per grid location cross-attends to the context tokens nearest to it.

    Gridded TNPs (Ashman et al., 2024), pseudo-token grid encoder: the initial pseudo-token ``u_m`` of grid
    location ``m`` is updated by one pre-norm MHCA + MLP block whose keys are the context tokens assigned to
    ``m``: those whose nearest grid location is ``m`` (``k = 1``) or, for ``k > 1``, the tokens that have ``m``
    among their ``k`` nearest locations. With ``self_key`` (the default, as in the paper's reference code) ``u_m``
    itself is one more key of its cell, so an empty cell attends to ``u_m`` alone; without it an empty cell keeps
    ``u_m`` plus the MLP residual (zero attention output). ``max_tokens_per_cell`` caps each cell's context keys;
    a fuller cell keeps the tokens nearest to its grid location (deterministic, and independent of the order of the
    context up to exact ties). The cells attend by ``segment_attention`` over (token, cell) entries: one softmax
    per cell over its own keys, with no buffer padded to the fullest cell and no host sync; keys/values are
    projected once per token.
    ``[B, N, in_dim]`` -> ``Latent([B, M1..Md, dim])``.

    Args:
        grid: the model's grid (passed by the model); one pseudo-token per point of it (or of its coarsened grid).
        dim: token width D of the pseudo-tokens.
        in_dim: width of the context tokens (a Linear maps them to ``dim`` when it differs); null for ``dim``.
        k: grid locations each context token is assigned to, its ``k`` nearest (1: its nearest only); >= 1.
        max_tokens_per_cell: most context tokens a cell attends to (the nearest to its location); null for no cap.
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of the block's MLP.
        coarsen: block size in points, an int or one per dimension: encode onto the block centres; null: no coarsening.
        self_key: each cell's initial pseudo-token is also one of its keys (the reference code); false: context only.
        relative_position: add an MLP embedding of each context token's offset from the cell's grid point (in grid
            spacings, wrapped) to its key and value: where in its cell each observation lies.
        shared_dims: grid dimensions along which the initial pseudo-tokens are shared (e.g. ``[0]``: one per
            (lat, lon) point for every hour of a time x lat x lon grid); null: one per grid point.
    """

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        in_dim: int | None = None,
        k: int = 1,
        max_tokens_per_cell: int | None = None,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        coarsen: int | Sequence[int] | None = None,
        self_key: bool = True,
        relative_position: bool = False,
        shared_dims: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        name = "pseudo_token"
        self.grid = target_grid(grid, coarsen, name)
        if any(not -self.grid.ndim <= int(d) < self.grid.ndim for d in shared_dims or ()):
            raise ValueError(f"grid encoder 'pseudo_token': shared_dims {shared_dims} must index the grid's dims.")
        shared = {int(d) % self.grid.ndim for d in shared_dims or ()}
        if k < 1:
            raise ValueError(f"grid encoder 'pseudo_token': k must be >= 1; got {k}.")
        if max_tokens_per_cell is not None and max_tokens_per_cell < 1:
            raise ValueError(
                f"grid encoder 'pseudo_token': max_tokens_per_cell must be >= 1 or None (no cap); "
                f"got {max_tokens_per_cell}."
            )
        self.in_dim = dim if in_dim is None else in_dim
        self.k, self.max_tokens_per_cell, self.self_key = k, max_tokens_per_cell, self_key
        self.proj_in = nn.Identity() if self.in_dim == dim else nn.Linear(self.in_dim, dim)
        token_shape = [1 if d in shared else n for d, n in enumerate(self.grid.shape)]
        self.pseudo_tokens = nn.Parameter(torch.randn(*token_shape, dim) * 0.02)
        self.block = CrossAttentionBlock(dim, heads, head_dim, mlp_dim)
        self.rel = mlp(self.grid.ndim, 2 * heads * head_dim, mlp_dim) if relative_position else None

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        t = concat_sources(sources)
        check_width(t, self.in_dim, "pseudo_token")
        b = t.mask.shape[0]
        m, dim = self.grid.num_points, self.pseudo_tokens.shape[-1]
        block, attn = self.block, self.block.attn
        u0 = self.pseudo_tokens.expand(*self.grid.shape, dim).reshape(m, dim)
        z = self.proj_in(zero_padding(t.z, t.mask))  # padded values may be NaN

        # One entry per (token, assigned cell): the token's key/value, attending in segment ``batch * m + cell``;
        # entries of padding, off-grid neighbours and tokens beyond the cap are not kept.
        cell, valid = assign_cells(self.grid, t.x, t.mask, self.k)  # [B, N, K]
        kk = cell.shape[-1]
        segment = (torch.arange(b, device=cell.device).view(b, 1, 1) * m + cell).flatten()  # [E]
        keep = valid.flatten()
        # Keys and values once per token, as two products (no [E, 2 H Dh] tensor to split and re-join).
        k, v = attn.kv_rows(block.norm_kv(z).flatten(0, 1))  # [B * N, H Dh]
        point = None  # token of each entry, where entries are not in token order
        if self.max_tokens_per_cell is not None:  # nearest first within each cell, so the cap drops the farthest
            g = grid_coordinates(self.grid, cell, dtype=torch.float32)
            x = torch.where(t.mask.unsqueeze(-1), t.x, 0.0).float().unsqueeze(-2)
            dist = (self.grid.difference(x, g) / g.new_tensor(self.grid.spacing)).square().sum(-1).flatten()
            order = torch.argsort(dist, stable=True)
            order = order[torch.argsort(torch.where(keep, segment, b * m)[order], stable=True)]
            segment, keep = segment[order], keep[order]
            counts = torch.bincount(torch.where(keep, segment, b * m), minlength=b * m + 1)
            rank = torch.arange(segment.numel(), device=segment.device) - (torch.cumsum(counts, 0) - counts)[segment]
            keep = keep & (rank < self.max_tokens_per_cell)
            point = torch.div(order, kk, rounding_mode="floor")
            k, v = k.index_select(0, point), v.index_select(0, point)
        elif kk > 1:  # entries in token order: token n's K entries are rows n K .. n K + K - 1
            k, v = (r.unsqueeze(1).expand(-1, kk, -1).flatten(0, 1) for r in (k, v))
        own = None
        if self.self_key:  # each cell's initial pseudo-token is one more key of the cell (offset 0)
            own = [o.to(k.dtype) for o in attn.kv_rows(block.norm_kv(u0))]  # [m, H Dh]
        if self.rel is not None:
            # Offset of each entry's token from its cell's grid point, in grid spacings (wrapped).
            x = torch.where(t.mask.unsqueeze(-1), t.x, 0.0).float().flatten(0, 1)  # [B * N, d]
            x = x.repeat_interleave(kk, 0) if point is None else x.index_select(0, point)
            g = grid_coordinates(self.grid, torch.remainder(segment, m), dtype=torch.float32)
            rel_k, rel_v = self.rel((self.grid.difference(x, g) / g.new_tensor(self.grid.spacing)).to(k.dtype)).chunk(
                2, -1
            )
            k, v = k + rel_k, v + rel_v
            if own is not None:
                rel_k, rel_v = self.rel(k.new_zeros(1, self.grid.ndim)).chunk(2, -1)
                own = [own[0] + rel_k, own[1] + rel_v]
        heads = (attn.heads, attn.head_dim)
        q = attn.to_q(block.norm_q(u0)).unflatten(-1, heads)  # [m, H, Dh]
        q = q.expand(b, -1, -1, -1).flatten(0, 1)  # one per cell of the batch: [B m, H, Dh]
        if own is not None:
            own = tuple(o.unflatten(-1, heads).expand(b, -1, -1, -1).flatten(0, 1).to(q.dtype) for o in own)
        k, v = k.unflatten(-1, heads).to(q.dtype), v.unflatten(-1, heads).to(q.dtype)
        out, has_key = segment_attention(q, k, v, segment, keep, own)  # [B m, H, Dh], [B m]
        out = attn.out(out.flatten(-2)) * has_key.unsqueeze(-1).to(u0.dtype)
        u = u0.expand(b, m, dim).flatten(0, 1) + out.to(u0.dtype)
        u = u + block.mlp(block.norm2(u))
        return Latent(u.reshape(b, *self.grid.shape, dim), grid=self.grid)
