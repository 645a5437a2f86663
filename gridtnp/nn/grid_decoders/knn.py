"""The k-nearest-neighbour grid decoders ``knn`` and ``te_knn``: each target attends to its ``K`` nearest grid
tokens (found by index arithmetic on the regular grid, ``O(N_t k)``), optionally with relative positions, a
distance bias and a skip connection to its nearest context points.

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, D]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, MultiHeadAttention
from gridtnp.nn.grid_decoders.gridded import gather_heads, state_grid
from gridtnp.nn.grids import Grid
from gridtnp.nn.mlp import mlp
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.single_query import neighbour_attention
from gridtnp.nn.te_attention import te_attention
from gridtnp.nn.tokens import Latent, Tokens, concat_sources, last_states
from gridtnp.registry import register


class NeighbourCrossAttentionBlock(CrossAttentionBlock):
    """Pre-norm MHCA + MLP where each target ``[B, Nt, D]`` attends only to its own ``K`` gathered grid tokens.

    Same parameters as ``CrossAttentionBlock`` (a dense block with a neighbourhood mask is the reference), plus,
    with ``rel_dim``, an MLP embedding of the target-to-grid-point offset that is added to the gathered keys (and,
    with ``rel_values``, a second one to the gathered values, so the update can depend on where each grid point
    lies, not only on which one is weighted). With a ``TEAttention`` the offsets enter the logits through its
    ``rho`` instead.
    """

    def __init__(
        self,
        dim: int = 128,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        rel_dim: int | None = None,
        attention: MultiHeadAttention | None = None,
        rel_values: bool = False,
        distance_bias: bool = False,
    ) -> None:
        super().__init__(dim, heads, head_dim, mlp_dim, attention=attention)
        self.rel = mlp(rel_dim, heads * head_dim * (1 + rel_values), mlp_dim) if rel_dim else None
        self.rel_values = bool(rel_dim) and rel_values
        if distance_bias and self.attn.located:
            raise ValueError(
                "NeighbourCrossAttentionBlock: distance_bias needs dot-product attention, not TE attention."
            )
        # -softplus(decay_h) |offset|^2 on each head's logits; decays spread from wide (0.1) to sharp (4) at init.
        self.decay = (
            nn.Parameter(torch.log(torch.expm1(torch.logspace(-1, math.log10(4.0), heads)))) if distance_bias else None
        )

    def forward(  # type: ignore[override]
        self, zq: Tensor, zkv: Tensor, index: Tensor, valid: Tensor, offset: Tensor | None = None
    ) -> Tensor:
        """``zq [B, Nt, D]`` attends to ``zkv [B, M, D]`` at ``index, valid [B, Nt, K]`` -> ``[B, Nt, D]``.

        ``offset [B, Nt, K, d]`` is the target-to-grid-point offset in grid spacings, used with ``rel_dim`` or TE
        attention.
        """
        b, nt, k = index.shape
        attn = self.attn
        if (self.rel is not None or attn.located or self.decay is not None) and offset is None:
            raise ValueError("NeighbourCrossAttentionBlock with rel_dim or TE attention needs the neighbours' offsets.")
        key_mask = valid.reshape(b * nt, k)
        if attn.located:  # TE attention: rho sees the offsets, through its own attend (per-head layout for SDPA)
            keys, values = attn.project_kv(self.norm_kv(zkv))
            keys, values = gather_heads(keys, index), gather_heads(values, index)  # [B*Nt, H, K, Dh]
            q = self.norm_q(zq).reshape(b * nt, 1, zq.shape[-1])
            out = attn.attend(q, keys, values, key_mask, offset.reshape(b * nt, 1, k, -1))
            return self.mix(zq, out.view(zq.shape))
        # Keys and values are projected once on the grid, as two products; each target reads its K rows of them.
        heads = (attn.heads, attn.head_dim)
        keys, values = attn.kv_rows(self.norm_kv(zkv))  # [B, M, H*Dh] each
        m = keys.shape[1]
        rows = (index + torch.arange(b, device=index.device).view(b, 1, 1) * m).view(b * nt, k)
        key_offset = value_offset = None
        if self.rel is not None:
            rel = embed_offsets(self.rel, offset.to(self.rel[0].weight.dtype))
            rel = rel.reshape(b * nt, k, 1 + self.rel_values, *heads)
            key_offset = rel[:, :, 0]
            value_offset = rel[:, :, 1] if self.rel_values else None
        bias = None
        if self.decay is not None:
            sq = offset.float().square().sum(-1).reshape(b * nt, k, 1)  # squared offsets in grid spacings
            bias = -F.softplus(self.decay).view(1, 1, -1) * sq  # [B*Nt, K, H]
        q = attn.to_q(self.norm_q(zq)).reshape(b * nt, *heads)
        flat = (keys.reshape(b * m, -1), values.reshape(b * m, -1))
        attended = neighbour_attention(q, *flat, rows, key_mask, bias, key_offset, value_offset)
        out = attn.out(attended.flatten(-2))
        out = out * key_mask.any(-1, keepdim=True).to(out.dtype)  # a target without grid neighbours: no update
        return self.mix(zq, out.view(zq.shape))


@register("grid_decoder", "knn")
class KNNDecoder(nn.Module):
    """Gridded TNP k-NN decoder: each target ``[B, Nt, D]`` cross-attends to its ``k`` nearest grid tokens.

    Ashman et al. (gridded TNPs): local MHCA from targets to the ``k`` grid tokens nearest to ``x_t``, found by
    index arithmetic (``Grid.neighbours``, ``O(N_t k)``); rolled dimensions wrap, and near the edge of an
    ordinary dimension a target attends only to the grid points that exist (a target with none gets a zero
    attention update). One block per processor state, so targets are refreshed after every processor layer
    (TNP eq. 9). ``relative_position`` adds a learned embedding of ``(x_t - g) / spacing`` (wrapped) to each
    gathered key (``true`` or ``keys``; ``keys_values``: to the values too), so attention can depend on where a
    grid point lies relative to the target, not only on its token; the embedding is an MLP ``d -> mlp_dim ->
    heads * head_dim`` per block (twice that with values). The state's grid is used when it carries one (a
    processor may coarsen it), else ``grid``.

    ``context_k > 0`` adds a skip connection from the context: each target also attends, in the same softmax, to its
    ``context_k`` nearest context tokens (the encoders' tokens of ``context_sources``, found by cell lists:
    ``gridtnp.nn.neighbours``; Euclidean in the input coordinates, nothing wraps), with their offsets in grid
    spacings. A target at an observed location then sees
    that observation itself, not only the grid tokens it was merged into, and can give it back.

    Args:
        grid: the grid of the states unless a state carries its own (passed by the model).
        dim: token width D.
        k: grid neighbours per target (e.g. 9 for 3 x 3 in 2-D); >= 1.
        layers: blocks, one per processor state read (the model passes the processor's number of states).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP (and of the ``relative_position`` embedding).
        relative_position: add a learned embedding of the target-to-grid-point offset to each gathered key (``true``
            or ``"keys"``), or to each key and value (``"keys_values"``); ``false``: none.
        dim_x: input dimension Dx (sizes the ``relative_position`` offset features; the grid's dimension if not given).
        context_k: also attend to this many nearest context tokens per target (0: grid tokens only).
        context_sources: the context sources whose tokens ``context_k`` reads; null: every source.
        distance_bias: add ``-softplus(a_h) |offset|^2`` (offset in grid spacings, one learned ``a_h`` per head) to
            the attention logits, so heads can prefer the nearest tokens (a kernel's locality; a context token at
            the target's own location wins in the sharpest heads).
    """

    def __init__(
        self,
        grid: Grid | None = None,
        dim: int = 128,
        k: int = 9,
        layers: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        relative_position: bool | Literal["keys", "keys_values"] = False,
        dim_x: int | None = None,
        context_k: int = 0,
        context_sources: Sequence[str] | None = None,
        distance_bias: bool = False,
    ) -> None:
        super().__init__()
        if relative_position not in (False, True, "keys", "keys_values"):
            raise ValueError(
                f"grid decoder '{self.registry_name}': relative_position must be false, true, 'keys' or "
                f"'keys_values'; got {relative_position!r}."
            )
        rel_dim = (
            offset_dim(grid, dim_x, f"grid decoder '{self.registry_name}' with relative_position")
            if relative_position
            else None
        )
        values = relative_position == "keys_values"
        self.build(
            grid,
            k,
            layers,
            lambda: NeighbourCrossAttentionBlock(
                dim, heads, head_dim, mlp_dim, rel_dim, rel_values=values, distance_bias=distance_bias
            ),
            context_k,
            context_sources,
        )

    def build(
        self,
        grid: Grid | None,
        k: int,
        layers: int,
        block: Callable[[], NeighbourCrossAttentionBlock],
        context_k: int = 0,
        context_sources: Sequence[str] | None = None,
    ) -> None:
        """Check ``k``, ``layers`` and ``context_k``, then make ``layers`` blocks."""
        name = self.registry_name
        if isinstance(context_k, bool) or not isinstance(context_k, int) or context_k < 0:
            raise ValueError(f"grid decoder {name!r}: context_k must be an integer >= 0; got {context_k!r}.")
        self.context_k = context_k
        self.context_sources = None if context_sources is None else list(context_sources)
        self.takes_context = context_k > 0  # the model passes the context tokens to forward
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"grid decoder {name!r}: k (the number of grid neighbours per target) must be >= 1; got {k!r}."
            )
        if layers < 1:
            raise ValueError(f"grid decoder {name!r}: layers must be >= 1; got {layers}.")
        self.grid, self.k = grid, k
        self.blocks = nn.ModuleList(block() for _ in range(layers))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor, context: dict[str, Tokens] | None = None) -> Tensor:
        """Target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]`` (``context``: the encoders' tokens
        per source, read with ``context_k``)."""
        xt = xt.float()  # coordinates such as longitudes lose too much in bf16
        neighbourhoods: dict[Grid, tuple[Tensor, Tensor, Tensor | None]] = {}  # one lookup per distinct grid
        skip = self._context_tokens(context, xt) if self.context_k else None
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), self.registry_name), strict=True):
            grid = state_grid(state, self.grid, self.registry_name)
            if grid not in neighbourhoods:
                needs_offsets = block.rel is not None or block.attn.located or block.decay is not None
                neighbourhoods[grid] = self._neighbours(grid, xt, needs_offsets)
            tokens, (index, valid, offset) = state.flat()[0], neighbourhoods[grid]
            if skip is not None:
                # Context tokens follow the grid's: one softmax over K grid and context_k context neighbours.
                z, c_index, c_valid, c_offset = skip
                index = torch.cat([index, c_index + tokens.shape[1]], -1)
                valid = torch.cat([valid, c_valid], -1)
                if offset is not None:
                    offset = torch.cat([offset, c_offset / offset.new_tensor(grid.spacing)], -2)
                tokens = torch.cat([tokens, z.to(tokens.dtype)], 1)
            zt = block(zt, tokens, index, valid, offset)
        return zt

    def _context_tokens(self, context: dict[str, Tokens] | None, xt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The ``context_k`` nearest context tokens of each target: tokens ``[B, Nc, D]``, indices and validity
        ``[B, Nt, k]`` and target-to-context offsets ``[B, Nt, k, d]`` in input units."""
        name = self.registry_name
        if not context:
            raise ValueError(f"grid decoder {name!r} with context_k needs the context tokens; the model passes them.")
        names = self.context_sources or list(context)
        missing = sorted(set(names) - set(context))
        if missing:
            raise ValueError(f"grid decoder {name!r}: context_sources {missing} are not among {sorted(context)}.")
        t = concat_sources({n: context[n] for n in names})
        xc = t.x.float()
        index, valid = knn_points(xc, t.mask, xt, self.context_k)
        near = torch.gather(xc, 1, index.flatten(1).unsqueeze(-1).expand(-1, -1, xc.shape[-1]))
        offset = xt.unsqueeze(-2) - near.view(*index.shape, xc.shape[-1])  # [B, Nt, k, d]
        return t.z, index, valid, offset

    def _neighbours(self, grid: Grid, xt: Tensor, offsets: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """Flat indices and validity ``[B, Nt, K]`` of the neighbours and, if needed, offsets ``[B, Nt, K, d]``."""
        if xt.shape[-1] != grid.ndim:
            raise ValueError(
                f"grid decoder {self.registry_name!r}: xt has {xt.shape[-1]} input dimension(s) but the grid "
                f"{grid} has {grid.ndim}."
            )
        index, valid = grid.neighbours(xt, self.k)
        if not offsets:
            return index, valid, None
        g = grid.points(xt.device).reshape(-1, grid.ndim)[index]  # [B, Nt, K, d]
        return index, valid, grid.difference(xt.unsqueeze(-2), g) / xt.new_tensor(grid.spacing)


def embed_offsets(embed: nn.Module, offset: Tensor) -> Tensor:
    """``embed`` applied to the offsets ``[B, Nt, K, d]`` -> ``[B, Nt, K, E]``, once if every task shares them.

    The tasks of a station batch target the same stations on the same grid, so their offsets are identical: one
    task's embedding, broadcast over the batch, gives the same values for ``1 / B`` of the cost.
    """
    if offset.shape[0] > 1 and torch.equal(offset, offset[:1].expand_as(offset)):
        return embed(offset[:1]).expand(offset.shape[0], *[-1] * (offset.dim() - 1))
    return embed(offset)


def offset_dim(grid: Grid | None, dim_x: int | None, where: str) -> int:
    """The number of offset features of a target-to-grid-point offset: ``dim_x``, else the grid's dimension."""
    if dim_x is not None:
        return dim_x
    if grid is None:
        raise ValueError(f"{where} needs dim_x or grid to size the offset features.")
    return grid.ndim


@register("grid_decoder", "te_knn")
class TEKNNDecoder(KNNDecoder):
    """k-NN grid decoder with TE attention: logits are an MLP of dot products and target-to-grid-point offsets.

    Each target attends to its ``k`` nearest grid tokens; the offsets are ``(x_t - g) / spacing`` (wrapped along
    rolled dimensions), so only where a grid point lies relative to the target matters, not where the target is.
    Same neighbour search as ``knn`` (``O(N_t k)``), one block per processor state.

    Args:
        grid: the model's grid (passed by the model).
        dim: token width D.
        k: grid neighbours per target.
        layers: blocks, one per processor state read (the model passes the processor's number of states).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        dim_x: input dimension Dx (sizes the offset features; the grid's dimension if not given).
        variant: ``post`` (rho of dot products and offsets) or ``pre`` (dot products plus rho of offsets).
        rotation: rho sees the offset's length (in grid spacings) only.
        rho_hidden: hidden width of rho.
    """

    def __init__(
        self,
        grid: Grid | None = None,
        dim: int = 128,
        k: int = 9,
        layers: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dim_x: int | None = None,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
    ) -> None:
        nn.Module.__init__(self)  # not KNNDecoder's: its blocks have plain attention
        rel_dim = offset_dim(grid, dim_x, f"grid decoder '{self.registry_name}'")
        attention = te_attention(dim, rel_dim, heads, head_dim, variant, rotation, rho_hidden, False, None)
        self.build(
            grid, k, layers, lambda: NeighbourCrossAttentionBlock(dim, heads, head_dim, mlp_dim, attention=attention())
        )
