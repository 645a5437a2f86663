"""k nearest context points of each target among scattered points, by cell lists (grid hashing).

``knn_points(xc [B, Nc, d], mask [B, Nc], xt [B, Nt, d], k) -> (index [B, Nt, k], valid [B, Nt, k])``.

The context points are binned into the cells of a regular grid over their bounding box (one grid for the whole
batch, about ``k / V_d`` points per cell on average, ``V_d`` the volume of the unit ball), sorted by (task, cell)
once, and each target then reads only the points of the cells around its own: first the ``3^d`` block around
its cell, then ever larger blocks ``(2r + 1)^d`` for the targets whose ``k``-th candidate is farther than the
block's edge (so the result is exact, not approximate). No ``[Nc, Nt]`` distance matrix is formed: the work is
the sort of the ``Nc`` cell keys plus, per target, the points of its block (about ``3^d k / V_d``).

Where a target's block holds fewer than ``k`` points, the block grows ring by ring until it holds ``k`` points
whose farthest is certified nearer than anything outside it, or covers the whole box; a task with fewer than ``k``
valid context points returns all of them and marks the remaining slots invalid (``valid`` False, index 0).
Euclidean distance in the coordinates given (scale them first for another metric); nothing wraps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MAX_CELLS = 1 << 22  # upper bound on the number of cells of the hashing grid (memory of the per-cell counts)


def unit_ball_volume(d: int) -> float:
    """Volume of the unit ball in ``d`` dimensions."""
    return math.pi ** (d / 2) / math.gamma(d / 2 + 1)


def knn_points(
    xc: Tensor, mask: Tensor, xt: Tensor, k: int, points_per_cell: float | None = None
) -> tuple[Tensor, Tensor]:
    """Indices ``[B, Nt, k]`` into ``xc [B, Nc, d]`` of each target's ``k`` nearest valid context points, nearest first.

    ``mask [B, Nc]`` marks real context points; ``xt [B, Nt, d]``. Slots beyond a task's number of valid points are
    invalid (``valid`` False, index 0). ``points_per_cell``: mean occupancy of the hashing grid's cells (default
    ``1.5 k / V_d``). Exact ties are broken arbitrarily. Indices only: no gradient flows (recompute distances from
    the indices where one is needed).
    """
    if k < 1:
        raise ValueError(f"knn_points: k must be >= 1; got {k}.")
    if xc.dim() != 3 or xt.dim() != 3 or xc.shape[-1] != xt.shape[-1] or mask.shape != xc.shape[:2]:
        raise ValueError(
            f"knn_points: needs xc [B, Nc, d], mask [B, Nc], xt [B, Nt, d]; got {tuple(xc.shape)}, "
            f"{tuple(mask.shape)}, {tuple(xt.shape)}."
        )
    b, nc, d = xc.shape
    nt = xt.shape[1]
    device = xc.device
    index = torch.zeros(b, nt, k, dtype=torch.long, device=device)
    found = torch.zeros(b, nt, k, dtype=torch.bool, device=device)
    mask = mask.bool()
    if nc == 0 or nt == 0 or not bool(mask.any()):
        return index, found
    xc = torch.where(mask.unsqueeze(-1), xc.detach().double(), 0.0)
    xt = xt.detach().double()

    # The hashing grid: cells of side h over the bounding box of the valid context points.
    inf = torch.tensor(float("inf"), dtype=xc.dtype, device=device)
    lower = torch.where(mask.unsqueeze(-1), xc, inf).amin((0, 1))
    upper = torch.where(mask.unsqueeze(-1), xc, -inf).amax((0, 1))
    extent = (upper - lower).clamp(min=0.0)
    per_task = float(mask.sum()) / b
    occupancy = points_per_cell or max(1.0, 1.5 * k / unit_ball_volume(d))
    spread = extent[extent > 0]
    if spread.numel():
        volume = float(spread.log().sum().exp())
        side = (volume * occupancy / per_task) ** (1.0 / spread.numel())
        cells = torch.where(extent > 0, torch.ceil(extent / side), 1.0).clamp(min=1.0)
    else:
        cells = torch.ones(d, dtype=xc.dtype, device=device)
    while float(cells.prod()) * b > MAX_CELLS and float(cells.max()) > 1:  # loop over halvings, at most ~22
        cells = torch.ceil(cells / 2)
    shape = [int(c) for c in cells.tolist()]
    size = torch.tensor(shape, device=device)
    step = torch.where(extent > 0, extent / cells, 1.0)
    num_cells = math.prod(shape)

    def cell_of(x: Tensor) -> tuple[Tensor, Tensor]:
        """Continuous cell coordinate ``u`` and clamped integer cell ``[..., d]``."""
        u = (x - lower) / step
        return u, torch.floor(u).long().clamp(min=0).minimum(size - 1)

    def flat(cell: Tensor) -> Tensor:
        out = torch.zeros_like(cell[..., 0])
        for dim_size, c in zip(shape, cell.unbind(-1), strict=True):  # loop over dimensions, not points
            out = out * dim_size + c
        return out

    # Sort the context by (task, cell) once: cell ``c`` of task ``t`` holds ``order[start[t, c] : start + count]``.
    batch = torch.arange(b, device=device)
    key = torch.where(mask, batch.view(b, 1) * num_cells + flat(cell_of(xc)[1]), b * num_cells).flatten()
    order = torch.argsort(key)
    counts = torch.bincount(key, minlength=b * num_cells + 1)[: b * num_cells]
    starts = torch.cumsum(counts, 0) - counts
    xc_flat = xc.reshape(b * nc, d)

    u, cell_t = cell_of(xt)  # [B, Nt, d]
    todo = torch.arange(b * nt, device=device)  # flat (task, target) ids still to certify
    u, cell_t, xt_flat = u.reshape(-1, d), cell_t.reshape(-1, d), xt.reshape(-1, d)
    index, found = index.reshape(-1, k), found.reshape(-1, k)
    radius = 1
    while todo.numel():  # loop over ring radii (at most max(shape)), not points
        span = torch.arange(-radius, radius + 1, device=device)
        offsets = torch.stack(torch.meshgrid(*[span] * d, indexing="ij"), -1).reshape(-1, d)  # [Q, d]
        q = offsets.shape[0]
        block = cell_t[todo].unsqueeze(1) + offsets  # [T, Q, d]
        inside = ((block >= 0) & (block < size)).all(-1)
        task = torch.div(todo, nt, rounding_mode="floor")
        slot = task.unsqueeze(1) * num_cells + flat(block.clamp(min=0).minimum(size - 1))
        cnt = torch.where(inside, counts[slot], 0).flatten()  # [T * Q]
        seg = torch.repeat_interleave(torch.arange(cnt.numel(), device=device), cnt)  # [P] (target, cell) pairs
        within = torch.arange(seg.numel(), device=device) - (torch.cumsum(cnt, 0) - cnt)[seg]
        point = order[starts[slot.flatten()[seg]] + within]  # flat context row (task * Nc + n)
        target = torch.div(seg, q, rounding_mode="floor")  # row of ``todo``
        dist = (xc_flat[point] - xt_flat[todo[target]]).square().sum(-1)
        by_dist = torch.argsort(dist, stable=True)
        by_target = by_dist[torch.argsort(target[by_dist], stable=True)]
        target, point, dist = target[by_target], point[by_target], dist[by_target]
        per_target = torch.bincount(target, minlength=todo.numel())
        rank = torch.arange(target.numel(), device=device) - (torch.cumsum(per_target, 0) - per_target)[target]
        keep = rank < k
        rows = todo[target[keep]]
        index[rows, rank[keep]] = point[keep] - torch.div(point[keep], nc, rounding_mode="floor") * nc
        found[rows, rank[keep]] = True
        # Certified when the k-th candidate is no farther than the nearest point outside the block could be.
        kth = torch.full((todo.numel(),), float("inf"), dtype=dist.dtype, device=device)
        full = keep & (rank == k - 1)
        kth[target[full]] = dist[full]
        low, high = cell_t[todo] - radius, cell_t[todo] + radius
        uu = u[todo]
        gap_low = torch.where(low <= 0, inf, (uu - low) * step)
        gap_high = torch.where(high >= size - 1, inf, (high + 1 - uu) * step)
        margin = torch.minimum(gap_low, gap_high).amin(-1)
        done = (kth <= margin.square()) | torch.isinf(margin)  # inf: the block covers the whole box
        todo = todo[~done]
        radius += 1
    return index.view(b, nt, k), found.view(b, nt, k)


__all__ = ["knn_points", "unit_ball_volume"]
