"""Kernel-interpolation grid encoder (KI-GE, SetConv): SE-kernel sums of the context tokens on the grid."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

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
from gridtnp.nn.setconv import grid_sum
from gridtnp.nn.tokens import Latent, Tokens, check_width, concat_sources
from gridtnp.registry import register


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
