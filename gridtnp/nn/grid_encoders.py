"""Grid encoders: per-source tokens at arbitrary locations -> pseudo-tokens (``Latent``).

Input: ``{source: Tokens(x [B, N_s, Dx], z [B, N_s, D_in], mask [B, N_s])}``. Output: a ``Latent``,
either on a regular grid ``[B, M1, ..., Md, D]`` or, for grid-free models, the set itself.

Sources: every encoder here except ``multi`` takes the union of all sources' tokens (``concat_sources``) and
encodes it onto one grid ("single" merging). ``multi`` encodes each source onto its own grid with its own inner
encoder and merges the grids.

Coarsening: the gridded encoders accept ``coarsen`` (an integer or one per dimension) and then encode straight
onto ``coarsen_grid(grid, coarsen)`` (block centres, ``M_d / coarsen_d`` points). The output ``Latent`` carries
that coarse grid, so the processor and decoder must be built for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock
from gridtnp.nn.gaussian import gaussian
from gridtnp.nn.grids import (
    Grid,
    assign_cells,
    great_circle,
    grid_coordinates,
    haversine_distance,
    haversine_lengthscale,
    initial_lengthscale,
    se_weights,
    target_grid,
)
from gridtnp.nn.mlp import mlp
from gridtnp.nn.processors.convolutional import channels_first, channels_last, conv_class
from gridtnp.nn.setconv import grid_sum
from gridtnp.nn.single_query import segment_attention
from gridtnp.nn.tokens import Latent, Tokens, check_width, concat_sources, zero_padding
from gridtnp.registry import build_from_spec, register


@register("grid_encoder", "identity")
class IdentityGridEncoder(nn.Module):
    """Grid-free models (CNP, TNP, PT-TNP): the union of all sources' tokens as a masked set ``[B, N, D]``.

    The latent keeps the locations ``x [B, N, Dx]`` and, in ``source [B, N]``, which context source each token came
    from (its index in ``sources``; for decoders that treat sources apart, such as ``interpolation``).

    Args:
        sources: names of the context sources in the model's order (passed by the model); null: the context's order.
    """

    def __init__(self, sources: Sequence[str] | None = None) -> None:
        super().__init__()
        self.sources = None if sources is None else list(sources)

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        t = concat_sources(sources)
        names = self.sources or list(sources)
        unknown = sorted(set(sources) - set(names))
        if unknown:
            raise ValueError(f"grid encoder 'identity': context source(s) {unknown} are not among {names}.")
        ids = torch.cat([torch.full(s.mask.shape, names.index(n), device=s.mask.device) for n, s in sources.items()], 1)
        return Latent(t.z, mask=t.mask, x=t.x, source=ids)


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


@register("grid_encoder", "kernel_interpolation")
class KernelInterpolationEncoder(nn.Module):
    """SetConv / KI-GE: SE-kernel sums of context tokens at every grid point, then Linear -> ``[B, M1..Md, dim]``.

    ``h(g) = sum_n k(x_n, g) z_n`` and the density ``d(g) = sum_n k(x_n, g)`` over valid context points.
    With ``density`` the output is ``Linear(cat[h / (d + eps), log(1 + d)])`` (ConvCNP, Gordon et al. 2020,
    Algorithm 1: ``phi(y) = [1, y]`` and the data channels divided by the density channel; the density enters
    as ``log(1 + d)`` so its scale does not grow with the context size), else ``Linear(h)``.
    Length-scales are learned per dimension (log-parametrised); rolled dimensions use the wrapped distance.
    The context is processed ``chunk_size`` points at a time, so memory is ``[B, chunk_size, M]``.

    ``nearest_only``: each point adds to its nearest grid location only (its ``k`` nearest with ``k``), with the
    same kernel weight as the dense sum, by a sparse scatter in O(N k) time and memory.
    ``distance="haversine"``: the LAST TWO input dimensions are (latitude, longitude) in degrees, and the kernel
    uses their great-circle distance in km with one length-scale for the pair (the last entry of
    ``lengthscale``; the others, one per leading dimension such as time, are as usual). With ``nearest_only``
    the nearest locations are found in coordinate space.

    Args:
        grid: the model's grid (passed by the model); one token per point of it (or of its coarsened grid).
        in_dim: width of the context tokens (the data channels).
        dim: token width D of the grid tokens (the output width of the Linear).
        lengthscale: starting length-scale(s), one or one per dimension (haversine: see above); null: twice the spacing.
        learn_lengthscale: learn the length-scales; false keeps them at their starting values.
        density: add the density channel and divide the data channels by it (ConvCNP); false for ``Linear(h)``.
        chunk_size: context points per step of the dense sum (memory ``[B, chunk_size, M]``); >= 1.
        eps: added to the density before the data channels are divided by it (with ``density``).
        nearest_only: each point adds to its nearest grid location(s) only, in O(N k), instead of to every one.
        k: with ``nearest_only``, the number of nearest grid locations each point adds to; null for 1.
        distance: ``euclidean``, or ``haversine`` (great-circle km over the last two dims, latitude and longitude).
        coarsen: block size in points, an int or one per dimension: encode onto the block centres; null: no coarsening.
    """

    def __init__(
        self,
        grid: Grid,
        in_dim: int,
        dim: int = 128,
        lengthscale: float | Sequence[float] | None = None,
        learn_lengthscale: bool = True,
        density: bool = True,
        chunk_size: int = 4096,
        eps: float = 1e-8,
        nearest_only: bool = False,
        k: int | None = None,
        distance: str = "euclidean",
        coarsen: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        name = "grid encoder 'kernel_interpolation'"
        if chunk_size < 1:
            raise ValueError(f"{name}: chunk_size must be >= 1; got {chunk_size}.")
        if distance not in ("euclidean", "haversine"):
            raise ValueError(f"{name}: distance must be 'euclidean' or 'haversine'; got {distance!r}.")
        if k is not None and not nearest_only:
            raise ValueError(f"{name}: k={k} only applies with nearest_only=True (the dense sum uses every point).")
        if k is not None and k < 1:
            raise ValueError(f"{name}: k must be >= 1; got {k}.")
        grid = target_grid(grid, coarsen, "kernel_interpolation")
        self.grid, self.in_dim, self.density, self.chunk_size, self.eps = grid, in_dim, density, chunk_size, eps
        self.nearest_only, self.k, self.distance = nearest_only, 1 if k is None else k, distance
        self.other_grid: Grid | None = None
        if distance == "haversine":
            if grid.ndim < 2:
                raise ValueError(f"{name}: distance='haversine' needs (latitude, longitude) as the last two dims.")
            log_l = haversine_lengthscale(grid, lengthscale, name).log()
            # The leading (non-spatial) dimensions keep the separable SE kernel on their own sub-grid.
            self.other_grid = (
                Grid(grid.lower[:-2], grid.upper[:-2], grid.shape[:-2], grid.roll[:-2]) if grid.ndim > 2 else None
            )
        else:
            log_l = initial_lengthscale(grid, lengthscale, name).log()
        if learn_lengthscale:
            self.log_lengthscale = nn.Parameter(log_l)
        else:
            self.register_buffer("log_lengthscale", log_l)
        self.proj = nn.Linear(in_dim + int(density), dim)

    @property
    def lengthscale(self) -> Tensor:
        """Current length-scales: ``[d]``, or ``[d - 1]`` for haversine (the last one in km)."""
        return self.log_lengthscale.exp()

    def pair_weights(self, x: Tensor, g: Tensor) -> Tensor:
        """Kernel ``[...]`` between points ``x [..., d]`` and grid coordinates ``g [..., d]`` (broadcast)."""
        ls = self.lengthscale.float()
        if self.distance == "euclidean":
            return gaussian((self.grid.difference(x, g) / ls).square().sum(-1))
        r = great_circle(x[..., -2:], g[..., -2:]) / ls[-1]
        other = (self.grid.difference(x, g)[..., :-2] / ls[:-1]).square().sum(-1)
        return gaussian(r.square() + other)

    def dense_weights(self, x: Tensor, mask: Tensor) -> Tensor:
        """Kernel between ``x [B, n, d]`` and every grid point, zero where ``mask`` is False: ``[B, n, M]``."""
        ls = self.lengthscale
        if self.distance == "euclidean":
            return se_weights(x, self.grid, ls, mask)
        x = torch.where(mask.unsqueeze(-1), x.float(), 0.0)
        lat_g, lon_g = (torch.deg2rad(a) for a in self.grid.axes(x.device, torch.float32)[-2:])
        lat, lon = torch.deg2rad(x[..., -2:-1]), torch.deg2rad(x[..., -1:])
        # The haversine is a + c * s with a, c per latitude and s per longitude: trig on [B, n, M_lat | M_lon] only.
        a = torch.sin((lat - lat_g) / 2).square()
        c = torch.cos(lat) * torch.cos(lat_g)
        s = torch.sin((lon - lon_g) / 2).square()
        h = a.unsqueeze(-1) + c.unsqueeze(-1) * s.unsqueeze(-2)  # [B, n, M_lat, M_lon]
        factors = 1 + (0 if self.other_grid is None else self.other_grid.ndim)  # multiplied by `other` below
        spatial = gaussian((haversine_distance(h) / ls[-1].float()).square(), factors).flatten(-2)
        if self.other_grid is None:
            return spatial * mask.unsqueeze(-1)
        other = se_weights(x[..., :-2], self.other_grid, ls[:-1], mask, factors)  # [B, n, M_other]
        return (other.unsqueeze(-1) * spatial.unsqueeze(-2)).flatten(-2)

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        t = concat_sources(sources)
        check_width(t, self.in_dim, "kernel_interpolation")
        b, m = t.z.shape[0], self.grid.num_points
        z = torch.where(t.mask.unsqueeze(-1), t.z.float(), 0.0)  # padded or missing values may be NaN
        # The density channel is the kernel sum of a constant 1 (ConvCNP): append it to the values.
        values = torch.cat([z, torch.ones_like(z[..., :1])], dim=-1) if self.density else z
        # Sums over many points, then a division by the density: kept in float32 even under bf16 autocast.
        with torch.autocast(device_type=values.device.type, enabled=False):
            if self.nearest_only:
                cell, valid = assign_cells(self.grid, t.x, t.mask, self.k)  # [B, N, K]
                x = torch.where(t.mask.unsqueeze(-1), t.x, 0.0).float().unsqueeze(-2)
                w = self.pair_weights(x, grid_coordinates(self.grid, cell)) * valid  # [B, N, K]
                bucket = (torch.arange(b, device=cell.device).view(b, 1, 1) * m + cell).flatten()
                contrib = (w.unsqueeze(-1) * values.unsqueeze(-2)).flatten(0, 2)
                h = values.new_zeros(b * m, values.shape[-1]).index_add(0, bucket, contrib).view(b, m, -1)
            elif self.distance == "euclidean":  # separable: never forms the [B, chunk, M] weights for narrow values
                h = grid_sum(t.x, self.grid, self.lengthscale, values, t.mask, self.chunk_size)
            else:
                h = values.new_zeros(b, m, values.shape[-1])
                for start in range(0, values.shape[1], self.chunk_size):  # loop over chunks of points, not points
                    stop = start + self.chunk_size
                    w = self.dense_weights(t.x[:, start:stop], t.mask[:, start:stop])  # [B, chunk, M]
                    h = h + (values[:, start:stop].transpose(1, 2) @ w).transpose(1, 2)  # [C, n] @ [n, M]: fast
            if self.density:
                h, d = h[..., :-1], h[..., -1:]
                # log1p keeps the density channel O(1): a raw kernel sum grows with the number of points per cell
                # (about 260 for the 2-D GP task's 10,000 points), which would swamp the data channels.
                h = torch.cat([h / (d + self.eps), torch.log1p(d)], dim=-1)
        out = self.proj(h.to(self.proj.weight.dtype))
        return Latent(out.reshape(b, *self.grid.shape, out.shape[-1]), grid=self.grid)


@register("grid_encoder", "multi")
class MultiSourceGridEncoder(nn.Module):
    """One inner grid encoder (and grid) per source, merged into one grid: ``Latent([B, M1..Md, dim])``.

    ``sources`` names the context sources; the model builder passes the model's sources unless the spec sets them:
    ``{name: multi, sources: [era5, stations], encoder: {name: pseudo_token}, merge: concat}``. ``encoder`` is one
    spec for every source or a mapping ``{source: spec}``. ``merge="sum"`` adds the grids; ``"concat"`` stacks
    them along the channels (in ``sources`` order) and applies a Linear back to ``dim``. A source missing from
    the input counts as having no observations. (The default elsewhere, "single", unions all sources' tokens
    into one encoder.)

    Args:
        grid: the model's grid (passed by the model), given to every inner encoder.
        sources: distinct names of the context sources (no '.'), one inner encoder each, in ``concat`` order.
        dim: token width D of the grid tokens (every inner encoder's ``dim``).
        in_dim: width of the context tokens, given to every inner encoder; null for ``dim``.
        encoder: inner grid encoder spec (or name) for all sources, or ``{source: spec}``; null for ``pseudo_token``.
        merge: ``concat`` (stack along the channels, then a Linear to ``dim``) or ``sum`` (add the grids).
    """

    def __init__(
        self,
        grid: Grid,
        sources: Sequence[str],
        dim: int = 128,
        in_dim: int | None = None,
        encoder: dict[str, Any] | str | None = None,
        merge: str = "concat",
    ) -> None:
        super().__init__()
        where = "grid encoder 'multi'"
        if isinstance(sources, str) or not sources or len(set(sources)) != len(sources):
            raise ValueError(f"{where}: sources must be a list of distinct source names; got {sources!r}.")
        if any("." in s or not s for s in sources):
            raise ValueError(f"{where}: source names must be non-empty and contain no '.'; got {list(sources)}.")
        if merge not in ("sum", "concat"):
            raise ValueError(f"{where}: merge must be 'sum' or 'concat'; got {merge!r}.")
        spec = {"name": "pseudo_token"} if encoder is None else encoder
        per_source = isinstance(spec, dict) and "name" not in spec
        if per_source and set(spec) != set(sources):
            raise ValueError(
                f"{where}: encoder must be one spec {{name: ...}} or one per source {sorted(sources)}; "
                f"got keys {sorted(spec)}."
            )
        self.sources, self.merge = list(sources), merge
        in_dim = dim if in_dim is None else in_dim
        self.encoders = nn.ModuleDict(
            {
                s: build_from_spec("grid_encoder", spec[s] if per_source else spec, grid=grid, dim=dim, in_dim=in_dim)
                for s in self.sources
            }
        )
        grids = {getattr(e, "grid", None) for e in self.encoders.values()}
        if len(grids) != 1:
            raise ValueError(f"{where}: the inner encoders write to different grids {grids}; give them one coarsen.")
        # The grid the processor and decoder are built for (the model reads it): a coarse one with ``coarsen``.
        self.grid = grids.pop()
        self.proj = nn.Linear(len(self.sources) * dim, dim) if merge == "concat" else nn.Identity()

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        unknown = set(sources) - set(self.sources)
        if unknown:
            raise ValueError(
                f"grid encoder 'multi' got source(s) {sorted(unknown)} it was not built for; its sources: "
                f"{self.sources}. Add them to the spec's sources list."
            )
        if not sources:
            raise ValueError("grid encoder 'multi' needs at least one source in its input.")
        ref = next(iter(sources.values()))
        empty = Tokens(ref.x[:, :0], ref.z[:, :0], ref.mask[:, :0])
        latents = [self.encoders[s]({s: sources.get(s, empty)}) for s in self.sources]  # loop over sources
        grid = latents[0].grid
        if any(lat.grid != grid or lat.tokens.shape != latents[0].tokens.shape for lat in latents):
            raise ValueError(
                "grid encoder 'multi': the inner encoders produced different grids "
                f"{[lat.grid for lat in latents]}; give them the same coarsen and dim."
            )
        if self.merge == "sum":
            tokens = torch.stack([lat.tokens for lat in latents]).sum(0)
        else:
            tokens = self.proj(torch.cat([lat.tokens for lat in latents], dim=-1))
        return Latent(tokens, grid=grid)


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
