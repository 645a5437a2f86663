"""Reading grid states at targets: the ``kernel_interpolation`` grid decoder and the gathers the grid decoders share
(``knn`` and ``te_knn`` are in ``knn``).

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, D]``. The states are grid
tokens ``[B, M1..Md, D]``; a state may carry its own (coarser) grid, else the decoder's ``grid`` is used. Neighbours
are found by index arithmetic on the regular grid (``Grid.neighbours``), ``O(N_t k)``, never by a distance matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gridtnp.nn.gaussian import gaussian
from gridtnp.nn.grids import Grid, initial_lengthscale
from gridtnp.nn.setconv import grid_interpolate
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


def gather_rows(t: Tensor, index: Tensor) -> Tensor:
    """Rows of ``t [B, M, C]`` at ``index [B, Nt, K]`` -> ``[B, Nt, K, C]`` (one ``index_select``, no per-item loop)."""
    b, m, c = t.shape
    offset = torch.arange(b, device=index.device).view(b, 1, 1) * m
    return t.reshape(b * m, c).index_select(0, (index + offset).reshape(-1)).view(*index.shape, c)


def gather_heads(t: Tensor, index: Tensor) -> Tensor:
    """Per-head rows of ``t [B, H, M, Dh]`` at ``index [B, Nt, K]`` -> ``[B * Nt, H, K, Dh]``, contiguous for SDPA."""
    b, h, m, dh = t.shape
    # Row (b, h, m) of the flattened table; gathering per head gives SDPA's layout without a transposed copy.
    offset = (
        torch.arange(b, device=index.device).view(b, 1, 1, 1) * h
        + torch.arange(h, device=index.device).view(1, 1, h, 1)
    ) * m
    rows = (index.unsqueeze(2) + offset).reshape(-1)  # [B * Nt * H * K]
    return t.reshape(b * h * m, dh).index_select(0, rows).view(b * index.shape[1], h, index.shape[2], dh)


def state_grid(state: Latent, grid: Grid | None, name: str) -> Grid:
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

    Args:
        grid: the grid of the states unless a state carries its own (passed by the model).
        dim: token width D.
        lengthscale: starting length-scale(s) in input units, one or one per grid dimension; null: twice the spacing.
        learn_lengthscale: learn the length-scales; false keeps them at their starting values.
        layers: must be 1 (the final state only); the model passes the processor's number of states, so set it to 1.
        chunk_size: targets per step (memory ``[B, chunk_size, M]``); >= 1.
        nearest: sum over the ``nearest^d`` grid points around each target only (e.g. 3); null for every grid point.
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
        grid = state_grid(states[-1], self.grid, "kernel_interpolation")
        u, _ = states[-1].flat()  # [B, M, D]
        u = u.float()
        lengthscale = self.lengthscale
        if self.nearest is None:
            out = grid_interpolate(xt, grid, lengthscale, u, self.chunk_size)  # every grid point
        else:
            chunks = [
                self._local(xt[:, start : start + self.chunk_size], u, grid, lengthscale)
                for start in range(0, xt.shape[1], self.chunk_size)  # loop over chunks of targets, not targets
            ]
            out = torch.cat(chunks, dim=1) if chunks else u.new_zeros(u.shape[0], 0, u.shape[-1])
        return self.proj(out.to(self.proj.weight.dtype))

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
        weights = gaussian(diff.square().sum(-1)) * valid  # [B, n, K]
        return (weights.unsqueeze(-2) @ gather_rows(u, index)).squeeze(-2)
