"""Grid decoders: processor states + target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]``.

A decoder with ``layers = L`` reads the last ``L`` processor states, one block per state, so targets
are refreshed after every processor layer as in the TNP (eq. 9); ``layers = 1`` reads the final state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, mlp
from gridtnp.nn.grids import Grid, initial_lengthscale, se_weights
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


def last_states(states: list[Latent], layers: int, name: str) -> list[Latent]:
    """The last ``layers`` states, with a clear error if the processor produced fewer."""
    if len(states) < layers:
        raise ValueError(
            f"grid decoder {name!r} has {layers} blocks but the processor produced {len(states)} state(s); "
            f"set the decoder's layers <= the processor's layers."
        )
    return states[len(states) - layers :]


@register("grid_decoder", "cross_attention")
class CrossAttentionDecoder(nn.Module):
    """MHCA from each target token to every pseudo-token (masked set or flattened grid), one block per state.

    On grid latents this is the gridded TNP paper's "full" decoder (Ashman et al.): every target attends to all
    ``M`` grid tokens, ``O(N_t M)``; ``knn`` is the local alternative.
    """

    def __init__(self, dim: int = 128, layers: int = 1, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "cross_attention"), strict=True):
            z, mask = state.flat()
            zt = block(zt, z, mask)
        return zt


@register("grid_decoder", "concat")
class ConcatDecoder(nn.Module):
    """CNP decoder: MLP on ``cat[zt, r]`` with ``r`` the single aggregated token ``[B, 1, D]``."""

    def __init__(self, dim: int = 128, hidden: int | None = None, layers: int = 3) -> None:
        super().__init__()
        self.net = mlp(2 * dim, dim, hidden or dim, layers)

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        r, _ = states[-1].flat()
        if r.shape[1] != 1:
            raise ValueError(
                f"grid decoder 'concat' needs one aggregated token [B, 1, D]; got {tuple(r.shape)}. "
                "Use processor 'mean'."
            )
        return self.net(torch.cat([zt, r.expand(-1, zt.shape[1], -1)], dim=-1))


def _gather_rows(t: Tensor, index: Tensor) -> Tensor:
    """Rows of ``t [B, M, C]`` at ``index [B, Nt, K]`` -> ``[B, Nt, K, C]`` (one ``index_select``, no per-item loop)."""
    b, m, c = t.shape
    offset = torch.arange(b, device=index.device).view(b, 1, 1) * m
    return t.reshape(b * m, c).index_select(0, (index + offset).reshape(-1)).view(*index.shape, c)


def _gather_heads(t: Tensor, index: Tensor) -> Tensor:
    """Per-head rows of ``t [B, H, M, Dh]`` at ``index [B, Nt, K]`` -> ``[B * Nt, H, K, Dh]``, contiguous for SDPA."""
    b, h, m, dh = t.shape
    # Row (b, h, m) of the flattened table; gathering per head gives SDPA's layout without a transposed copy.
    offset = (
        torch.arange(b, device=index.device).view(b, 1, 1, 1) * h
        + torch.arange(h, device=index.device).view(1, 1, h, 1)
    ) * m
    rows = (index.unsqueeze(2) + offset).reshape(-1)  # [B * Nt * H * K]
    return t.reshape(b * h * m, dh).index_select(0, rows).view(b * index.shape[1], h, index.shape[2], dh)


def _state_grid(state: Latent, grid: Grid | None, name: str) -> Grid:
    """The grid of ``state`` (a processor may coarsen it), else the decoder's own; checks the token shape."""
    grid = state.grid if state.grid is not None else grid
    if grid is None or state.mask is not None or tuple(state.tokens.shape[1:-1]) != grid.shape:
        expected = f"[B, {', '.join(map(str, grid.shape))}, D] on {grid}" if grid is not None else "[B, M1..Md, D]"
        raise ValueError(
            f"grid decoder {name!r} needs grid tokens {expected}; got {tuple(state.tokens.shape)} "
            f"(state grid {state.grid}). Use a grid encoder and a grid processor, or pass the model's grid."
        )
    return grid


@register("grid_decoder", "kernel_interpolation")
class KernelInterpolationDecoder(nn.Module):
    """SetConv decoder (ConvCNP): ``Linear(sum_m k(x_t, g_m) u_m)`` from the final grid state; ignores ``zt``.

    SE kernel with learned per-dimension length-scales (log-parametrised), wrapped along rolled dimensions,
    unnormalised as in ConvCNP (Gordon et al. 2020, Algorithm 1, last step). Targets are processed
    ``chunk_size`` at a time, so memory is ``[B, chunk_size, M]``. With ``nearest = s`` the sum runs only over
    the ``s^d`` grid points around each target (``Grid.neighbours``), ``O(N_t s^d)`` instead of ``O(N_t M)``;
    points off the edge of an ordinary dimension contribute nothing. The state's own grid is used when it
    carries one (a processor may coarsen the grid), else ``grid``.
    """

    def __init__(
        self,
        grid: Grid,
        dim: int = 128,
        lengthscale: float | Sequence[float] | None = None,
        learn_lengthscale: bool = True,
        layers: int = 1,
        chunk_size: int = 4096,
        nearest: int | None = None,
    ) -> None:
        super().__init__()
        if layers != 1:
            raise ValueError(
                f"grid decoder 'kernel_interpolation' reads only the final processor state, so layers must be 1; got "
                f"{layers}. The model builder passes the processor's number of states; put 'layers: 1' in the "
                "grid_decoder spec to decode from the final state only."
            )
        if chunk_size < 1:
            raise ValueError(f"grid decoder 'kernel_interpolation': chunk_size must be >= 1; got {chunk_size}.")
        if nearest is not None and (isinstance(nearest, bool) or not isinstance(nearest, int) or nearest < 1):
            raise ValueError(
                "grid decoder 'kernel_interpolation': nearest is the number of grid points per dimension to sum "
                f"over (e.g. 3 for the 3^d nearest) or null for all; got {nearest!r}."
            )
        self.grid, self.chunk_size, self.nearest = grid, chunk_size, nearest
        log_l = initial_lengthscale(grid, lengthscale, "grid decoder 'kernel_interpolation'").log()
        if learn_lengthscale:
            self.log_lengthscale = nn.Parameter(log_l)
        else:
            self.register_buffer("log_lengthscale", log_l)
        self.proj = nn.Linear(dim, dim)

    @property
    def lengthscale(self) -> Tensor:
        """Current per-dimension length-scales ``[d]``."""
        return self.log_lengthscale.exp()

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        grid = _state_grid(states[-1], self.grid, "kernel_interpolation")
        u, _ = states[-1].flat()  # [B, M, D]
        u = u.float()
        lengthscale = self.lengthscale
        interpolate = self._dense if self.nearest is None else self._local
        chunks = [
            interpolate(xt[:, start : start + self.chunk_size], u, grid, lengthscale)
            for start in range(0, xt.shape[1], self.chunk_size)  # loop over chunks of targets, not targets
        ]
        out = torch.cat(chunks, dim=1) if chunks else u.new_zeros(u.shape[0], 0, u.shape[-1])
        return self.proj(out.to(self.proj.weight.dtype))

    @staticmethod
    def _dense(xt: Tensor, u: Tensor, grid: Grid, lengthscale: Tensor) -> Tensor:
        """``xt [B, n, d]``, ``u [B, M, D]`` -> ``[B, n, D]`` summing over every grid point."""
        return se_weights(xt, grid, lengthscale) @ u

    def _local(self, xt: Tensor, u: Tensor, grid: Grid, lengthscale: Tensor) -> Tensor:
        """``xt [B, n, d]``, ``u [B, M, D]`` -> ``[B, n, D]`` summing over the ``nearest^d`` neighbours only."""
        if xt.shape[-1] != grid.ndim:
            raise ValueError(
                f"grid decoder 'kernel_interpolation': xt has {xt.shape[-1]} input dimension(s) but the grid "
                f"{grid} has {grid.ndim}."
            )
        xt = xt.float()  # coordinates such as longitudes lose too much in bf16
        index, valid = grid.neighbours(xt, self.nearest**grid.ndim)  # [B, n, K]
        g = grid.points(xt.device).reshape(-1, grid.ndim)[index]  # [B, n, K, d]
        diff = grid.difference(xt.unsqueeze(-2), g) / lengthscale.float()
        weights = torch.exp(-0.5 * diff.square().sum(-1)) * valid  # [B, n, K]
        return (weights.unsqueeze(-2) @ _gather_rows(u, index)).squeeze(-2)


class NeighbourCrossAttentionBlock(CrossAttentionBlock):
    """Pre-norm MHCA + MLP where each target ``[B, Nt, D]`` attends only to its own ``K`` gathered grid tokens.

    Same parameters as ``CrossAttentionBlock`` (a dense block with a neighbourhood mask is the reference), plus,
    with ``rel_dim``, an MLP embedding of the target-to-grid-point offset that is added to the gathered keys.
    """

    def __init__(
        self, dim: int = 128, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128, rel_dim: int | None = None
    ) -> None:
        super().__init__(dim, heads, head_dim, mlp_dim)
        self.rel = mlp(rel_dim, heads * head_dim, mlp_dim) if rel_dim else None

    def forward(  # type: ignore[override]
        self, zq: Tensor, zkv: Tensor, index: Tensor, valid: Tensor, offset: Tensor | None = None
    ) -> Tensor:
        """``zq [B, Nt, D]`` attends to ``zkv [B, M, D]`` at ``index, valid [B, Nt, K]`` -> ``[B, Nt, D]``.

        ``offset [B, Nt, K, d]`` is the target-to-grid-point offset in grid spacings, used with ``rel_dim``.
        """
        b, nt, k = index.shape
        heads, head_dim = self.attn.heads, self.attn.head_dim
        # Keys/values are projected once on the grid ([B, H, M, Dh]) and then gathered, not projected per copy.
        keys, values = self.attn.project_kv(self.norm_kv(zkv))
        keys, values = _gather_heads(keys, index), _gather_heads(values, index)  # [B*Nt, H, K, Dh]
        if self.rel is not None:
            if offset is None:
                raise ValueError("NeighbourCrossAttentionBlock with rel_dim needs the offsets of the neighbours.")
            rel = self.rel(offset.to(self.rel[0].weight.dtype)).view(b * nt, k, heads, head_dim).transpose(1, 2)
            keys = keys + rel
        # Targets become the batch dimension: one SDPA call, queries [B*Nt, H, 1, Dh] vs keys [B*Nt, H, K, Dh].
        q = self.norm_q(zq).reshape(b * nt, 1, zq.shape[-1])
        zq = zq + self.attn.attend(q, keys, values, valid.reshape(b * nt, k)).view(zq.shape)
        return zq + self.mlp(self.norm2(zq))


@register("grid_decoder", "knn")
class KNNDecoder(nn.Module):
    """Gridded TNP k-NN decoder: each target ``[B, Nt, D]`` cross-attends to its ``k`` nearest grid tokens.

    Ashman et al. (gridded TNPs): local MHCA from targets to the ``k`` grid tokens nearest to ``x_t``, found by
    index arithmetic (``Grid.neighbours``, ``O(N_t k)``); rolled dimensions wrap, and near the edge of an
    ordinary dimension a target attends only to the grid points that exist (a target with none gets a zero
    attention update). One block per processor state, so targets are refreshed after every processor layer
    (TNP eq. 9). ``relative_position`` adds a learned embedding of ``(x_t - g) / spacing`` (wrapped) to each
    gathered key, so attention can depend on where a grid point lies relative to the target, not only on its
    token; the embedding is an MLP ``d -> mlp_dim -> heads * head_dim`` per block. The state's grid is used when
    it carries one (a processor may coarsen it), else ``grid``.
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
        relative_position: bool = False,
        dim_x: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"grid decoder 'knn': k (the number of grid neighbours per target) must be >= 1; got {k!r}."
            )
        if layers < 1:
            raise ValueError(f"grid decoder 'knn': layers must be >= 1; got {layers}.")
        rel_dim = None
        if relative_position:
            rel_dim = dim_x if dim_x is not None else (grid.ndim if grid is not None else None)
            if rel_dim is None:
                raise ValueError("grid decoder 'knn' with relative_position needs dim_x or grid to size the embedding.")
        self.grid, self.k = grid, k
        self.blocks = nn.ModuleList(
            NeighbourCrossAttentionBlock(dim, heads, head_dim, mlp_dim, rel_dim) for _ in range(layers)
        )

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        """Target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]``."""
        xt = xt.float()  # coordinates such as longitudes lose too much in bf16
        neighbourhoods: dict[Grid, tuple[Tensor, Tensor, Tensor | None]] = {}  # one lookup per distinct grid
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "knn"), strict=True):
            grid = _state_grid(state, self.grid, "knn")
            if grid not in neighbourhoods:
                neighbourhoods[grid] = self._neighbours(grid, xt, block.rel is not None)
            zt = block(zt, state.flat()[0], *neighbourhoods[grid])
        return zt

    def _neighbours(self, grid: Grid, xt: Tensor, offsets: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """Flat indices and validity ``[B, Nt, K]`` of the neighbours and, if needed, offsets ``[B, Nt, K, d]``."""
        if xt.shape[-1] != grid.ndim:
            raise ValueError(
                f"grid decoder 'knn': xt has {xt.shape[-1]} input dimension(s) but the grid {grid} has {grid.ndim}."
            )
        index, valid = grid.neighbours(xt, self.k)
        if not offsets:
            return index, valid, None
        g = grid.points(xt.device).reshape(-1, grid.ndim)[index]  # [B, Nt, K, d]
        return index, valid, grid.difference(xt.unsqueeze(-2), g) / xt.new_tensor(grid.spacing)
