"""The learned linear-interpolation baseline as a grid decoder: ``interpolation``.

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, D]``; reads the final state
only (``layers = 1``) and ignores ``zt``. With the ``identity`` encoder (tokens = the values), the ``identity`` grid
encoder and processor (the context set kept as it is, with its locations and sources) and the ``homoscedastic``
likelihood with ``layers: 1`` (an affine map of the interpolant and a learned constant variance), the whole model
is the interpolation plus a handful of parameters (preset ``interp``). ``multilinear`` and ``inverse_distance``
are the two interpolation methods, usable on their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.grid_decoders.gridded import gather_rows
from gridtnp.nn.grids import as_grid
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register

IDW_EPS = 1e-12  # added to d^p in inverse-distance weights, so a target on a context point takes its value


def source_axes(spec: Mapping[str, Any], where: str) -> list[Tensor]:
    """Node coordinates ``[M_d]`` per dimension of a rectilinear source grid: ``{axes: [[...], ...]}`` (increasing)
    or a regular grid ``{lower, upper, shape}`` (both ends included)."""
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"{where}: a gridded source needs {{axes: [[...], ...]}} or {{lower, upper, shape}}; got {spec!r}."
        )
    if "axes" in spec:
        if set(spec) != {"axes"}:
            raise ValueError(f"{where}: give either axes or lower/upper/shape, not both; got keys {sorted(spec)}.")
        axes = [torch.tensor([float(v) for v in a], dtype=torch.float64) for a in spec["axes"]]
    else:
        grid = as_grid({**spec, "roll": [False] * len(spec.get("shape", []))})
        axes = [a.double() for a in grid.axes(dtype=torch.float64)]
    for d, a in enumerate(axes):
        if a.numel() < 1 or (a.numel() > 1 and not bool((a[1:] > a[:-1]).all())):
            raise ValueError(
                f"{where}: axis {d} must hold one or more strictly increasing coordinates; got {a.tolist()}."
            )
    return axes


def multilinear(axes: Sequence[Tensor], xs: Tensor, ys: Tensor, mask: Tensor, xt: Tensor) -> tuple[Tensor, Tensor]:
    """(Bi/tri)linear interpolation of a gridded source at ``xt [B, Nt, d]`` -> ``([B, Nt, Dy], available [B, Nt])``.

    The source's points ``xs [B, N, d]`` (values ``ys [B, N, Dy]``, ``mask [B, N]``) are snapped to their nearest
    node of the rectilinear grid ``axes`` (several points on one node are averaged); each target then takes the
    multilinear weights of the ``2^d`` nodes of its cell, renormalised over the nodes that hold a value (a missing
    node drops out). Outside the grid a target is clamped to its edge (constant extrapolation). A target whose
    ``2^d`` nodes are all empty is not available (its value is 0).
    """
    b, n, dy = ys.shape
    d = xs.shape[-1]
    if len(axes) != d or xt.shape[-1] != d:
        raise ValueError(f"multilinear: the grid has {len(axes)} dimension(s) but the points have {d}.")
    sizes = [int(a.numel()) for a in axes]
    m = math.prod(sizes)
    axes = [a.to(device=xs.device, dtype=torch.float64) for a in axes]
    xs, xt = xs.detach().double(), xt.detach().double()
    node = torch.zeros(b, n, dtype=torch.long, device=xs.device)
    for a, size, x in zip(axes, sizes, xs.unbind(-1), strict=True):  # loop over dimensions (d <= 3), not points
        nearest = torch.bucketize(x.contiguous(), (a[1:] + a[:-1]) / 2) if size > 1 else torch.zeros_like(node)
        node = node * size + nearest
    rows = (torch.arange(b, device=xs.device).view(b, 1) * m + node)[mask]
    table = ys.new_zeros(b * m, dy).index_add(0, rows, ys[mask])
    count = torch.zeros(b * m, device=xs.device).index_add(0, rows, torch.ones_like(rows, dtype=torch.float32))
    table = table / count.clamp(min=1).unsqueeze(-1).to(table.dtype)

    low, frac = [], []
    for a, size, x in zip(axes, sizes, xt.unbind(-1), strict=True):  # loop over dimensions
        if size == 1:
            low.append(torch.zeros_like(x, dtype=torch.long))
            frac.append(torch.zeros_like(x))
            continue
        j = (torch.bucketize(x.contiguous(), a) - 1).clamp(0, size - 2)
        low.append(j)
        frac.append(((x - a[j]) / (a[j + 1] - a[j])).clamp(0.0, 1.0))
    weights, index = [], []
    for corner in range(2**d):  # loop over the 2^d cell corners, not points
        flat = torch.zeros_like(low[0])
        w = torch.ones_like(frac[0])
        for dim, (size, j, t) in enumerate(zip(sizes, low, frac, strict=True)):
            bit = (corner >> (d - 1 - dim)) & 1
            flat = flat * size + (j + bit).clamp(max=size - 1)
            w = w * (t if bit else 1 - t)
        weights.append(w)
        index.append(flat)
    index_t = torch.stack(index, -1)  # [B, Nt, 2^d]
    present = gather_rows(count.view(b, m, 1), index_t)[..., 0] > 0
    w = torch.stack(weights, -1).float() * present
    # A target on a cell edge may give its only present node weight 0: then average the present nodes.
    w = torch.where(w.sum(-1, keepdim=True) > 0, w, present.float())
    total = w.sum(-1, keepdim=True)
    values = (w.unsqueeze(-2).to(ys.dtype) @ gather_rows(table.view(b, m, dy), index_t)).squeeze(-2)
    return values / total.clamp(min=1e-30).to(ys.dtype), total[..., 0] > 0


def inverse_distance(xs: Tensor, ys: Tensor, mask: Tensor, xt: Tensor, k: int, power: float) -> tuple[Tensor, Tensor]:
    """Inverse-distance weighting over the ``k`` nearest points: ``([B, Nt, Dy], available [B, Nt])``.

    ``sum_i w_i y_i / sum_i w_i`` with ``w_i = 1 / (|x_t - x_i|^power + 1e-12)`` over the ``k`` nearest valid points
    of ``xs [B, N, d]`` (``knn_points``: cell lists, no ``[N, Nt]`` distance matrix); ``k = 1`` is nearest-neighbour
    interpolation. A target on a context point takes its value. A task without valid points is not available.
    """
    index, valid = knn_points(xs, mask, xt, k)
    near = gather_rows(xs.detach().float(), index)  # [B, Nt, k, d]
    dist = (xt.detach().float().unsqueeze(-2) - near).square().sum(-1).sqrt()
    w = valid / (dist.pow(power) + IDW_EPS)
    total = w.sum(-1, keepdim=True)
    values = (w.unsqueeze(-2).to(ys.dtype) @ gather_rows(ys, index)).squeeze(-2)
    return values / total.clamp(min=1e-30).to(ys.dtype), valid.any(-1)


def check_final(name: str, layers: int) -> None:
    """``layers`` must be 1: these decoders read the final state only (the model passes the processor's states)."""
    if layers != 1:
        raise ValueError(
            f"grid decoder {name!r} reads only the final processor state, so layers must be 1; got {layers}. Put "
            "'layers: 1' in the grid_decoder spec."
        )


@register("grid_decoder", "interpolation")
class InterpolationDecoder(nn.Module):
    """Learned linear-interpolation baseline: each source interpolated to the targets, combined with learned weights.

    The {On, Off}-the-grid thesis's baseline (Section 4.2.2, Table 4.3). Reads the context set kept by the
    ``identity`` grid encoder and processor (tokens = the values, from the ``identity`` encoder, and each token's
    source). Each context source ``s`` is interpolated on its own: a source named in ``gridded`` by multilinear
    (bi/trilinear) interpolation on its rectilinear grid (missing nodes drop out of the weights; constant outside
    the grid), any other by inverse-distance weighting over its ``k`` nearest points (``w = 1 / d^power``; no
    triangulation library: IDW needs only the cell-list k-NN search of ``gridtnp.nn.neighbours``, O(N_c log N_c +
    N_t k)). The interpolants ``I_s [B, Nt, Dy]`` are combined as ``sum_s pi_s I_s`` with ``pi = softmax(w)`` over the
    sources available at the target (learned logits ``w [S, Dy]``, equal at the start); a target no source reaches
    gets 0. Output ``[B, Nt, dim]``: the interpolant itself when ``dim`` equals the tokens' width ``in_dim`` (the
    presets set the model's ``dim`` to ``dim_y``), else a Linear of it; follow it with the ``homoscedastic``
    likelihood with ``layers: 1`` (affine map, learned constant variance).

    Args:
        dim: output width D (the model's dim).
        in_dim: width of the context tokens (the ``identity`` encoder's ``dim_y``; passed by the model); null: ``dim``.
        sources: names of the context sources in the model's order (passed by the model).
        gridded: ``{source: {axes: [[...], ...]}}`` or ``{source: {lower, upper, shape}}`` for the sources on a grid
            (their points are snapped to its nodes); null: every source is scattered.
        k: nearest points per target for inverse-distance weighting of scattered sources; >= 1 (1: nearest value).
        power: exponent of the inverse distance (2 is Shepard's); > 0.
        layers: must be 1 (the final state only); the model passes the processor's number of states.
    """

    def __init__(
        self,
        dim: int = 1,
        in_dim: int | None = None,
        sources: Sequence[str] | None = None,
        gridded: Mapping[str, Mapping[str, Any]] | None = None,
        k: int = 4,
        power: float = 2.0,
        layers: int = 1,
    ) -> None:
        super().__init__()
        name = "grid decoder 'interpolation'"
        check_final("interpolation", layers)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{name}: k must be an integer >= 1; got {k!r}.")
        if not power > 0:
            raise ValueError(f"{name}: power must be > 0; got {power}.")
        self.sources = list(sources) if sources is not None else ["points"]
        gridded = dict(gridded or {})
        unknown = sorted(set(gridded) - set(self.sources))
        if unknown:
            raise ValueError(f"{name}: gridded names source(s) {unknown} that the model does not have: {self.sources}.")
        self.axes = {s: source_axes(spec, f"{name}, gridded source {s!r}") for s, spec in gridded.items()}
        self.in_dim = dim if in_dim is None else in_dim
        self.k, self.power = k, power
        self.logits = nn.Parameter(torch.zeros(len(self.sources), self.in_dim))
        self.proj = nn.Identity() if self.in_dim == dim else nn.Linear(self.in_dim, dim)

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        state = states[-1]
        if state.grid is not None or state.mask is None:
            raise ValueError(
                "grid decoder 'interpolation' reads the context set: use grid encoder 'identity' and processor "
                "'identity' (encoder 'identity' for the values)."
            )
        x, (z, mask) = state.locations("grid decoder 'interpolation'"), state.as_set()
        if z.shape[-1] != self.in_dim:
            raise ValueError(
                f"grid decoder 'interpolation' was built with in_dim={self.in_dim} but the context tokens are "
                f"{z.shape[-1]} wide; use encoder 'identity' (tokens = the values) and leave in_dim to the model."
            )
        source = state.source if state.source is not None else torch.zeros_like(mask, dtype=torch.long)
        values, available = [], []
        for s, name in enumerate(self.sources):  # loop over sources (a few), not points
            m = mask & (source == s)
            if name in self.axes:
                v, a = multilinear(self.axes[name], x, z.float(), m, xt)
            else:
                v, a = inverse_distance(x, z.float(), m, xt, self.k, self.power)
            values.append(v)
            available.append(a)
        v, a = torch.stack(values, -2), torch.stack(available, -1)  # [B, Nt, S, Dy], [B, Nt, S]
        logits = self.logits.float().masked_fill(~a.unsqueeze(-1), float("-inf"))
        weights = torch.softmax(logits, dim=-2).nan_to_num(0.0)  # a target no source reaches: all -inf -> 0
        return self.proj((weights * v).sum(-2).to(z.dtype))
