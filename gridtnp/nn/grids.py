"""The regular grid of a gridded model: coordinates, nearest-cell index arithmetic, rolled dimensions.

A grid has ``shape = (M1, ..., Md)`` points along the ``d = Dx`` input dimensions. Along an ordinary
dimension the points are ``linspace(lower, upper, M)`` (both ends included); along a rolled (periodic)
dimension such as longitude they are ``lower + i * (upper - lower) / M`` with ``upper - lower`` the
period, so index ``M`` wraps to ``0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gridtnp.nn.gaussian import gaussian


class Grid:
    """Coordinate system of a regular grid over ``[lower, upper]`` with ``shape`` points."""

    def __init__(
        self,
        lower: Sequence[float],
        upper: Sequence[float],
        shape: Sequence[int],
        roll: Sequence[bool] | None = None,
    ) -> None:
        lower, upper, shape = tuple(map(float, lower)), tuple(map(float, upper)), tuple(map(int, shape))
        roll = tuple(bool(r) for r in roll) if roll is not None else (False,) * len(shape)
        if not (len(lower) == len(upper) == len(shape) == len(roll)):
            raise ValueError(
                f"Grid: lower {lower}, upper {upper}, shape {shape} and roll {roll} must have one entry per "
                "input dimension."
            )
        for d, (lo, hi, m, r) in enumerate(zip(lower, upper, shape, roll, strict=True)):
            if not hi > lo:
                raise ValueError(f"Grid: dimension {d} needs upper > lower; got lower={lo}, upper={hi}.")
            if m < (1 if r else 2):
                raise ValueError(f"Grid: dimension {d} needs at least 2 points (1 if rolled); got {m}.")
        self.lower, self.upper, self.shape, self.roll = lower, upper, shape, roll

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def num_points(self) -> int:
        n = 1
        for m in self.shape:
            n *= m
        return n

    @property
    def spacing(self) -> tuple[float, ...]:
        """Distance between neighbouring points along each dimension."""
        return tuple(
            (hi - lo) / (m if r else m - 1)
            for lo, hi, m, r in zip(self.lower, self.upper, self.shape, self.roll, strict=True)
        )

    def axes(self, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> list[Tensor]:
        """Point coordinates along each dimension, ``[M_d]`` each."""
        return [
            lo + step * torch.arange(m, device=device, dtype=dtype)
            for lo, step, m in zip(self.lower, self.spacing, self.shape, strict=True)
        ]

    def points(self, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
        """All grid coordinates ``[M1, ..., Md, d]``."""
        return torch.stack(torch.meshgrid(*self.axes(device, dtype), indexing="ij"), dim=-1)

    def nearest_index(self, x: Tensor) -> Tensor:
        """Per-dimension index of the nearest grid point, ``[..., d]`` long (clamped; rolled dims wrap). O(N)."""
        lower = x.new_tensor(self.lower)
        step = x.new_tensor(self.spacing)
        idx = torch.round((x - lower) / step).long()
        size = torch.tensor(self.shape, device=x.device)
        roll = torch.tensor(self.roll, device=x.device)
        return torch.where(roll, torch.remainder(idx, size), idx.clamp(min=0).minimum(size - 1))

    def flat_index(self, index: Tensor) -> Tensor:
        """Row-major flat index ``[...]`` of per-dimension indices ``[..., d]``."""
        flat = torch.zeros_like(index[..., 0])
        for d, m in enumerate(self.shape):  # loop over dimensions (d <= 3), not points
            flat = flat * m + index[..., d]
        return flat

    def neighbours(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Flat indices ``[..., K]`` of the grid points nearest to ``x [..., d]`` and their validity mask.

        The candidates are the hypercube of ``s = ceil(k^(1/d))`` points per dimension around ``x``, found by
        index arithmetic in O(N) (no pairwise distances to the whole grid). Off the edge of an ordinary
        dimension a candidate is invalid (``False``); rolled dimensions wrap. When ``s^d > k`` the ``k``
        nearest candidates are kept (``K = k``), else ``K = s^d = k``. Invalid entries have index 0.
        """
        if k < 1:
            raise ValueError(f"neighbours: k must be >= 1; got {k}.")
        d = self.ndim
        s = math.ceil(round(k ** (1.0 / d), 9))
        if s > min(self.shape):
            raise ValueError(f"neighbours: k={k} needs {s} points per dimension but the grid {self} has fewer.")
        lower, step = x.new_tensor(self.lower), x.new_tensor(self.spacing)
        u = (x - lower) / step  # continuous grid index
        start = torch.ceil(u - s / 2).long()  # first of the s integers nearest to u
        offsets = torch.stack(torch.meshgrid(*[torch.arange(s, device=x.device)] * d, indexing="ij"), -1)
        index = start.unsqueeze(-2) + offsets.reshape(-1, d)  # [..., s^d, d]
        size = torch.tensor(self.shape, device=x.device)
        roll = torch.tensor(self.roll, device=x.device)
        inside = (index >= 0) & (index < size)
        valid = (inside | roll).all(-1)
        index = torch.where(roll, torch.remainder(index, size), index.clamp(min=0).minimum(size - 1))
        if s**d > k:
            dist = (self.difference(x.unsqueeze(-2), index * step + lower) / step).square().sum(-1)
            dist = dist.masked_fill(~valid, float("inf"))
            nearest = dist.topk(k, dim=-1, largest=False).indices
            index = index.gather(-2, nearest.unsqueeze(-1).expand(*nearest.shape, d))
            valid = valid.gather(-1, nearest)
        return torch.where(valid, self.flat_index(index), 0), valid

    def difference(self, x: Tensor, g: Tensor) -> Tensor:
        """``x - g`` with rolled dimensions wrapped into ``[-period/2, period/2)``; broadcasts."""
        diff = x - g
        if any(self.roll):
            period = diff.new_tensor([hi - lo for lo, hi in zip(self.lower, self.upper, strict=True)])
            wrapped = torch.remainder(diff + period / 2, period) - period / 2
            diff = torch.where(torch.tensor(self.roll, device=diff.device), wrapped, diff)
        return diff

    def to_dict(self) -> dict[str, list]:
        """The recipe mapping ``{lower, upper, shape, roll}`` that ``as_grid`` reads back."""
        return {
            "lower": list(self.lower),
            "upper": list(self.upper),
            "shape": list(self.shape),
            "roll": list(self.roll),
        }

    def __repr__(self) -> str:
        lower, upper, shape, roll = map(list, (self.lower, self.upper, self.shape, self.roll))
        return f"Grid(lower={lower}, upper={upper}, shape={shape}, roll={roll})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grid) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


def as_grid(spec: Grid | dict | None) -> Grid | None:
    """A ``Grid`` from a recipe mapping ``{lower: [...], upper: [...], shape: [...], roll: [...]}``."""
    if spec is None or isinstance(spec, Grid):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"grid must be a mapping with lower, upper, shape (and optionally roll); got {spec!r}.")
    unknown = set(spec) - {"lower", "upper", "shape", "roll"}
    if unknown:
        raise ValueError(f"grid has unknown key(s) {sorted(unknown)}; allowed: lower, upper, shape, roll.")
    return Grid(**spec)


def se_weights(
    x: Tensor, grid: Grid, lengthscale: Tensor, mask: Tensor | None = None, factors: int | None = None
) -> Tensor:
    """SE kernel ``exp(-0.5 sum_d ((x_d - g_d) / l_d)^2)`` between ``x [B, N, d]`` and every grid point: ``[B, N, M]``.

    ``lengthscale`` is ``[d]``; rolled dimensions use the wrapped difference. Points with ``mask [B, N]`` False
    get weight 0 (even if their ``x`` is NaN). The kernel is separable, so only ``[B, N, M_d]`` factors are
    formed per dimension before their outer product (grid points row-major). Computed in float32 whatever the
    input dtype, since coordinates such as longitudes lose too much in bf16. Factors too small for a product of
    ``factors`` of them (default: the grid's dimensions) to stay a normal float are zero (``nn.gaussian``).
    """
    if x.shape[-1] != grid.ndim:
        raise ValueError(f"se_weights: x has {x.shape[-1]} input dimension(s) but the grid {grid} has {grid.ndim}.")
    x = x.float()
    if mask is not None:
        x = torch.where(mask.unsqueeze(-1), x, 0.0)  # padded x may be garbage or NaN
    lengthscale = lengthscale.float()
    size_max = max(grid.shape)
    # Axes padded to a common length so that ``grid.difference`` (which wraps per dimension) runs once.
    axes = torch.stack(
        [torch.nn.functional.pad(a, (0, size_max - a.numel())) for a in grid.axes(x.device, torch.float32)], dim=-1
    )  # [M_max, d]
    diff = grid.difference(x.unsqueeze(-2), axes) / lengthscale  # [B, N, M_max, d]
    per_axis = gaussian(diff.square(), factors or grid.ndim)  # [B, N, M_max, d]
    weights = per_axis[..., : grid.shape[0], 0]
    if mask is not None:
        weights = weights * mask.unsqueeze(-1)
    for d in range(1, grid.ndim):  # loop over input dimensions (d <= 3), not points
        weights = (weights.unsqueeze(-1) * per_axis[..., : grid.shape[d], d].unsqueeze(-2)).flatten(-2)
    return weights


def initial_lengthscale(grid: Grid, lengthscale: float | Sequence[float] | None, where: str) -> Tensor:
    """Per-dimension starting length-scales ``[d]``: ``lengthscale`` (one value or one per dimension) or 2 x spacing."""
    if lengthscale is None:
        values = [2.0 * s for s in grid.spacing]
    elif isinstance(lengthscale, (int, float)):
        values = [float(lengthscale)] * grid.ndim
    else:
        values = [float(v) for v in lengthscale]
    if len(values) != grid.ndim or not all(v > 0 for v in values):
        raise ValueError(
            f"{where}: lengthscale must be one positive number or {grid.ndim} (one per grid dimension); "
            f"got {lengthscale!r}."
        )
    return torch.tensor(values)


EARTH_RADIUS_KM = 6371.0  # mean Earth radius (IUGG), the default unit of ``great_circle``


def coarsen_grid(grid: Grid, factor: int | Sequence[int]) -> Grid:
    """The grid of block centres when every ``factor`` points per dimension merge: shape ``M_d / factor_d``.

    Block ``j`` along a dimension covers the fine points ``j f, ..., j f + f - 1`` and sits at their mean, so the
    coarse spacing is ``f`` times the fine one. Rolled dimensions stay rolled with the same period.
    """
    factors = (int(factor),) * grid.ndim if isinstance(factor, int) else tuple(int(f) for f in factor)
    if len(factors) != grid.ndim or any(f < 1 for f in factors):
        raise ValueError(
            f"coarsen: factor must be one integer >= 1 or {grid.ndim} of them (one per grid dimension); got {factor!r}."
        )
    lower, upper, shape = [], [], []
    for d, (lo, hi, m, r, f, step) in enumerate(
        zip(grid.lower, grid.upper, grid.shape, grid.roll, factors, grid.spacing, strict=True)
    ):
        if m % f != 0:
            raise ValueError(f"coarsen: dimension {d} has {m} points, which factor {f} does not divide; {grid}.")
        if not r and m // f < 2:
            raise ValueError(
                f"coarsen: factor {f} leaves dimension {d} with {m // f} point(s); an ordinary (not rolled) dimension "
                f"needs at least 2. Use a smaller factor; {grid}."
            )
        half = (f - 1) / 2 * step
        lower.append(lo + half)
        upper.append(hi + half if r else hi - half)  # rolled: same period, shifted with the first centre
        shape.append(m // f)
    return Grid(lower, upper, shape, grid.roll)


def grid_coordinates(grid: Grid, flat: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Coordinates ``[..., d]`` of the grid points with row-major flat indices ``flat [...]``."""
    index = torch.unravel_index(flat, grid.shape)
    return torch.stack(
        [lo + step * i.to(dtype) for lo, step, i in zip(grid.lower, grid.spacing, index, strict=True)], dim=-1
    )


def haversine_distance(h: Tensor, radius: float = EARTH_RADIUS_KM) -> Tensor:
    """Great-circle distance ``2 r asin(sqrt(h))`` from the haversine ``h [...]`` of the central angle."""
    h = h.clamp(0.0, 1.0)
    inside = (h > 0) & (h < 1)
    # sqrt and asin have infinite slopes at 0 and 1: keep those ends out of the differentiated branch.
    safe = torch.where(inside, h, 0.5)
    far = torch.where(h >= 1, math.pi * radius, 0.0)
    return torch.where(inside, 2.0 * radius * torch.asin(torch.sqrt(safe)), far)


def great_circle(a: Tensor, b: Tensor, radius: float = EARTH_RADIUS_KM) -> Tensor:
    """Haversine distance ``[...]`` between ``(latitude, longitude)`` pairs in degrees, ``a, b [..., 2]`` (broadcast).

    In units of ``radius`` (km on the Earth by default; ``radius=1`` gives radians). Longitudes wrap by themselves.
    """
    if a.shape[-1] != 2 or b.shape[-1] != 2:
        raise ValueError(
            f"great_circle: inputs must end in (latitude, longitude) pairs; got {tuple(a.shape)}, {tuple(b.shape)}."
        )
    lat1, lon1 = torch.deg2rad(a).unbind(-1)
    lat2, lon2 = torch.deg2rad(b).unbind(-1)
    h = torch.sin((lat2 - lat1) / 2).square()
    h = h + torch.cos(lat1) * torch.cos(lat2) * torch.sin((lon2 - lon1) / 2).square()
    return haversine_distance(h, radius)


def haversine_lengthscale(grid: Grid, lengthscale: float | Sequence[float] | None, where: str) -> Tensor:
    """Starting length-scales ``[d - 1]`` for the haversine kernel: leading dims, then the (lat, lon) pair in km.

    Default: 2 x spacing for leading dimensions and 2 x the coarser of the lat/lon spacings (in km at the
    equator) for the pair.
    """
    if lengthscale is None:
        spatial = 2.0 * math.radians(max(grid.spacing[-2:])) * EARTH_RADIUS_KM
        values = [2.0 * s for s in grid.spacing[:-2]] + [spatial]
    elif isinstance(lengthscale, (int, float)):
        values = [float(lengthscale)] * (grid.ndim - 1)
    else:
        values = [float(v) for v in lengthscale]
    if len(values) != grid.ndim - 1 or not all(v > 0 for v in values):
        raise ValueError(
            f"{where}: with distance='haversine', lengthscale must be one positive number or {grid.ndim - 1} "
            f"(one per leading dimension, then one in km for the (latitude, longitude) pair); got {lengthscale!r}."
        )
    return torch.tensor(values)


def assign_cells(grid: Grid, x: Tensor, mask: Tensor, k: int = 1) -> tuple[Tensor, Tensor]:
    """Flat indices ``[B, N, K]`` of each point's ``k`` nearest grid locations and their validity ``[B, N, K]``.

    Index arithmetic only (``Grid.nearest_index`` / ``Grid.neighbours``), O(N K). Points with ``mask`` False
    (whose ``x`` may be NaN) and neighbours off the edge of an ordinary dimension are invalid.
    """
    x = torch.where(mask.unsqueeze(-1), x, 0.0)
    if k == 1:
        return grid.flat_index(grid.nearest_index(x)).unsqueeze(-1), mask.unsqueeze(-1)
    cell, valid = grid.neighbours(x, k)
    return cell, valid & mask.unsqueeze(-1)


def target_grid(grid: Grid | None, coarsen: int | Sequence[int] | None, name: str) -> Grid:
    """The grid a gridded encoder writes to: the model's ``grid``, or its ``coarsen``-times coarser block centres."""
    if grid is None:
        raise ValueError(
            f"grid encoder {name!r} needs the model's grid: set grid: {{lower: [...], upper: [...], shape: [...]}} "
            "in the model specification (or pass grid=Grid(...))."
        )
    if coarsen is None:
        return grid
    try:
        return coarsen_grid(grid, coarsen)
    except ValueError as err:
        raise ValueError(f"grid encoder {name!r}: {err}") from err
