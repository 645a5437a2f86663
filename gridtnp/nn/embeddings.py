"""Embeddings of input locations, used by the point-wise encoders (``embed: {name: ...}`` in an encoder's spec).

Interface: ``embedding(x [B, N, Dx]) -> [B, N, out_dim]``; every embedding has an ``out_dim`` attribute.
``identity`` (raw coordinates), ``fourier`` (sines and cosines at log-spaced wavelengths per dimension),
``spherical_harmonics`` (latitude/longitude in degrees), ``temporal`` (a time column), ``learned_grid`` (learned
features on a lattice, interpolated: what is particular to each place), ``composite`` (embeddings of chosen columns,
concatenated).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.grids import as_grid
from gridtnp.registry import build_from_spec, register


@register("embedding", "identity")
class IdentityEmbedding(nn.Module):
    """Raw input coordinates: ``[B, N, Dx] -> [B, N, Dx]``."""

    def __init__(self, dim_x: int) -> None:
        super().__init__()
        self.out_dim = dim_x

    def forward(self, x: Tensor) -> Tensor:
        return x


@register("embedding", "fourier")
class FourierEmbedding(nn.Module):
    """Fourier features per input dimension: ``[B, N, Dx] -> [B, N, Dx * (2L + 1)]``.

    ``L`` wavelengths, log-spaced between ``min_wavelength`` and ``max_wavelength``; the raw
    coordinate is kept alongside ``sin(2 pi x / lambda)`` and ``cos(2 pi x / lambda)``.

    Args:
        dim_x: input dimension Dx (every input dim gets the same features).
        num_wavelengths: number of wavelengths L.
        min_wavelength: shortest wavelength, in input units; > 0.
        max_wavelength: longest wavelength, in input units; > ``min_wavelength``.
    """

    def __init__(
        self, dim_x: int, num_wavelengths: int = 16, min_wavelength: float = 0.01, max_wavelength: float = 10.0
    ) -> None:
        super().__init__()
        if not 0 < min_wavelength < max_wavelength:
            raise ValueError(
                f"fourier embedding needs 0 < min_wavelength < max_wavelength; got {min_wavelength}, {max_wavelength}."
            )
        wavelengths = torch.logspace(math.log10(min_wavelength), math.log10(max_wavelength), num_wavelengths)
        self.register_buffer("frequencies", 2 * math.pi / wavelengths, persistent=False)
        self.out_dim = dim_x * (2 * num_wavelengths + 1)

    def forward(self, x: Tensor) -> Tensor:
        phase = x.unsqueeze(-1) * self.frequencies.to(x.dtype)  # [B, N, Dx, L]
        return torch.cat([x, phase.sin().flatten(-2), phase.cos().flatten(-2)], dim=-1)


def _normalised_legendre_coefficients(degrees: int) -> tuple[Tensor, Tensor, Tensor]:
    """Recurrence coefficients ``a, b [L, L]`` (degree ``l``, order ``m``) and diagonal factors ``c [L]``.

    For the orthonormalised associated Legendre functions ``P̄_l^m = K_l^m P_l^m`` (no Condon-Shortley phase),
    ``P̄_m^m = c_m sin(theta)^m`` and ``P̄_l^m = a_lm (cos(theta) P̄_{l-1}^m - b_lm P̄_{l-2}^m)`` for ``l > m``
    (Holmes & Featherstone 2002, eqs. 11-12): stable, and no factorials that overflow at high degree.
    """
    a = torch.zeros(degrees, degrees, dtype=torch.float64)
    b = torch.zeros(degrees, degrees, dtype=torch.float64)
    for ell in range(1, degrees):
        for m in range(ell):
            a[ell, m] = math.sqrt((4 * ell**2 - 1) / (ell**2 - m**2))
            b[ell, m] = math.sqrt(((ell - 1) ** 2 - m**2) / (4 * (ell - 1) ** 2 - 1)) if ell >= 2 else 0.0
    c = torch.ones(degrees, dtype=torch.float64) / math.sqrt(4 * math.pi)
    for m in range(1, degrees):
        c[m] = c[m - 1] * math.sqrt((2 * m + 1) / (2 * m))
    return a, b, c


def _split_dims(dim_x: int, used: tuple[int, ...], what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``used`` made non-negative and checked, and the remaining dims of ``range(dim_x)`` in order."""
    norm = tuple(d + dim_x if d < 0 else d for d in used)
    if any(not 0 <= d < dim_x for d in norm) or len(set(norm)) != len(norm):
        raise ValueError(f"{what} must be distinct input dims in range(dim_x) with dim_x = {dim_x}; got {used}.")
    return norm, tuple(d for d in range(dim_x) if d not in norm)


@register("embedding", "spherical_harmonics")
class SphericalHarmonicsEmbedding(nn.Module):
    """Real spherical harmonics of (latitude, longitude) in degrees: ``[B, N, Dx] -> [B, N, (Dx - 2) + L^2]``.

    Russwurm et al. (2024), "Geographic location encoding with spherical harmonics and sinusoidal representation
    networks": with ``L = legendre_polynomials`` Legendre polynomials, the degrees are ``l = 0 .. L - 1`` and every
    order ``-l <= m <= l``, so ``L^2`` features (100 for the paper's L = 10), ordered ``(l, m)`` as
    ``l^2 + l + m``. They are orthonormal on the unit sphere (``Y_0^0 = 1 / sqrt(4 pi)``), without the
    Condon-Shortley phase, with colatitude ``theta = 90 - lat`` and azimuth ``phi = lon``:
    ``Y_l^m = sqrt(2) P̄_l^m(cos theta) cos(m phi)`` for ``m > 0``, ``sqrt(2) P̄_l^|m| sin(|m| phi)`` for
    ``m < 0``. The other input dims (time, height, ...) are passed through raw, in order, before the features;
    embed them differently with a ``composite`` embedding.

    Args:
        dim_x: input dimension Dx; >= 2.
        legendre_polynomials: number of Legendre polynomials L (degrees ``0 .. L - 1``, ``L^2`` features); >= 1.
        lat_lon_dims: the (latitude, longitude) input dims, negative counting from the end; null for the last two.
    """

    def __init__(
        self, dim_x: int = 2, legendre_polynomials: int = 10, lat_lon_dims: tuple[int, int] | None = None
    ) -> None:
        super().__init__()
        if dim_x < 2:
            raise ValueError(f"spherical_harmonics needs dim_x >= 2 (latitude and longitude); got dim_x = {dim_x}.")
        if legendre_polynomials < 1:
            raise ValueError(f"spherical_harmonics needs legendre_polynomials >= 1; got {legendre_polynomials}.")
        lat_lon, rest = _split_dims(dim_x, tuple(lat_lon_dims or (dim_x - 2, dim_x - 1)), "lat_lon_dims")
        if len(lat_lon) != 2:
            raise ValueError(f"lat_lon_dims must be two input dims (latitude, longitude); got {lat_lon_dims}.")
        L = legendre_polynomials
        self.lat_dim, self.lon_dim = lat_lon
        self.register_buffer("rest", torch.tensor(rest, dtype=torch.long), persistent=False)
        # float64 constants, cast to the input's precision in forward (see ``constants``).
        for name, value in zip("abc", _normalised_legendre_coefficients(L), strict=True):
            self.register_buffer(name, value, persistent=False)
        ell = torch.cat([torch.full((2 * k + 1,), k) for k in range(L)])
        m = torch.cat([torch.arange(-k, k + 1) for k in range(L)])
        # Feature (l, m) = P̄[l, |m|] * trig[m + L - 1] * scale, gathered from flat tables in one step.
        self.register_buffer("legendre_index", ell * L + m.abs(), persistent=False)
        self.register_buffer("trig_index", m + L - 1, persistent=False)
        self.register_buffer("nonzero_order", m != 0, persistent=False)
        self.register_buffer("orders", torch.arange(L), persistent=False)
        self.legendre_polynomials = L
        self.out_dim = len(rest) + L * L

    def constants(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The recurrence constants ``a, b, c`` in float64, rebuilt if the module was cast (``.half()``, ...)."""
        if self.a.dtype == torch.float64:
            return self.a, self.b, self.c
        a, b, c = _normalised_legendre_coefficients(self.legendre_polynomials)
        return a.to(device), b.to(device), c.to(device)

    def harmonics(self, lat: Tensor, lon: Tensor) -> Tensor:
        """``Y_l^m`` at latitude and longitude in degrees ``[...]`` -> ``[..., L^2]``, in float32 (or float64)."""
        dtype = torch.promote_types(lat.dtype, torch.float32)
        L = self.legendre_polynomials
        lat = torch.deg2rad(lat.to(dtype))
        # Reduce longitude in degrees first so that lon and lon + 360 give the same angle exactly.
        lon = torch.deg2rad(torch.remainder(lon.to(dtype), 360.0))
        cos_t, sin_t = torch.sin(lat), torch.cos(lat).clamp(min=0)  # cos / sin of the colatitude
        a, b, c = (t.to(dtype) for t in self.constants(lat.device))
        orders = self.orders.to(dtype)
        # Diagonal P̄_m^m for all m at once; then the three-term recurrence over degrees, vectorised over orders.
        # sin^m by a cumulative product (a pow would give NaN gradients at the poles, where sin = 0).
        powers = torch.cat([torch.ones_like(sin_t).unsqueeze(-1), sin_t.unsqueeze(-1).expand(*sin_t.shape, L - 1)], -1)
        diagonal = c * powers.cumprod(-1)  # [..., L]
        is_diag = torch.eye(L, dtype=torch.bool, device=lat.device)
        below = torch.ones(L, L, device=lat.device).tril(-1).bool()  # m < l
        prev, prev2 = torch.zeros_like(diagonal), torch.zeros_like(diagonal)
        rows = []
        for ell in range(L):
            row = a[ell] * (cos_t.unsqueeze(-1) * prev - b[ell] * prev2)
            row = torch.where(is_diag[ell], diagonal, torch.where(below[ell], row, 0.0))
            rows.append(row)
            prev2, prev = prev, row
        legendre = torch.stack(rows, dim=-2).flatten(-2)  # [..., L * L], index l * L + m
        angle = lon.unsqueeze(-1) * orders  # [..., L]
        trig = torch.cat([torch.sin(angle[..., 1:]).flip(-1), torch.cos(angle)], dim=-1)  # m = -(L-1) .. L-1
        scale = 1 + (math.sqrt(2) - 1) * self.nonzero_order.to(dtype)  # sqrt(2) for m != 0
        return legendre[..., self.legendre_index] * trig[..., self.trig_index] * scale

    def forward(self, x: Tensor) -> Tensor:
        features = self.harmonics(x[..., self.lat_dim], x[..., self.lon_dim]).to(x.dtype)
        return torch.cat([x.index_select(-1, self.rest), features], dim=-1)


@register("embedding", "temporal")
class TemporalEmbedding(nn.Module):
    """Fourier features of time in hours since 1970: ``[B, N, Dx] -> [B, N, (Dx - 1) + 2 L]``.

    ``L = num_wavelengths`` wavelengths log-spaced from ``min_wavelength`` to ``max_wavelength`` hours (1 h to
    8,760 h = 365 days), or exactly ``wavelengths`` (e.g. ``[24, 8766]`` for the diurnal cycle and the mean
    tropical year). Output: the other input dims raw, in order, then ``sin(2 pi t / lambda)`` for each wavelength,
    then the cosines. The raw time is dropped (it is ~5e5 and would swamp an MLP).

    Hours since 1970 are ~4.6e5 in 2022; a float32 phase ``2 pi t / lambda`` there is off by up to
    ~0.25 rad for ``lambda = 1 h``, so the time is reduced modulo each wavelength in float64 before the
    result is cast back. Float32 inputs are still rounded to 2^-5 h (~2 min) at that magnitude; pass float64
    times for finer resolution.

    Args:
        dim_x: input dimension Dx.
        time_dim: the input dim holding the time in hours since 1970, negative counting from the end.
        num_wavelengths: number of log-spaced wavelengths L; >= 1. Unused with ``wavelengths``.
        min_wavelength: shortest log-spaced wavelength, in hours; > 0. Unused with ``wavelengths``.
        max_wavelength: longest log-spaced wavelength, in hours; > ``min_wavelength``. Unused with ``wavelengths``.
        wavelengths: the wavelengths in hours, all > 0, instead of the log-spaced ones; null for the log-spaced ones.
    """

    def __init__(
        self,
        dim_x: int = 1,
        time_dim: int = 0,
        num_wavelengths: int = 16,
        min_wavelength: float = 1.0,
        max_wavelength: float = 8760.0,
        wavelengths: list[float] | None = None,
    ) -> None:
        super().__init__()
        (self.time_dim,), rest = _split_dims(dim_x, (time_dim,), "time_dim")
        if wavelengths is None:
            if not 0 < min_wavelength < max_wavelength or num_wavelengths < 1:
                raise ValueError(
                    "temporal embedding needs 0 < min_wavelength < max_wavelength and num_wavelengths >= 1; got "
                    f"{min_wavelength}, {max_wavelength}, {num_wavelengths}."
                )
            lam = torch.logspace(
                math.log10(min_wavelength), math.log10(max_wavelength), num_wavelengths, dtype=torch.float64
            )
        else:
            lam = torch.tensor(list(wavelengths), dtype=torch.float64)
            if lam.numel() == 0 or (lam <= 0).any():
                raise ValueError(f"temporal embedding needs positive wavelengths (hours); got {wavelengths}.")
        self.register_buffer("wavelengths", lam, persistent=False)  # float64 on purpose: see the class docstring
        self._wavelengths = tuple(lam.tolist())  # to rebuild them if the module is cast to a lower precision
        self.register_buffer("rest", torch.tensor(rest, dtype=torch.long), persistent=False)
        self.out_dim = len(rest) + 2 * lam.numel()

    def forward(self, x: Tensor) -> Tensor:
        t = x[..., self.time_dim].double().unsqueeze(-1)  # [B, N, 1]
        lam = self.wavelengths
        if lam.dtype != torch.float64:  # the module was cast (``.float()``, ``.half()``): keep the full precision
            lam = torch.tensor(self._wavelengths, dtype=torch.float64, device=x.device)
        phase = (2 * math.pi) * (torch.remainder(t, lam) / lam)  # in [0, 2 pi), exact to float64 rounding
        dtype = x.dtype if x.dtype.is_floating_point else torch.float32
        return torch.cat([x.index_select(-1, self.rest).to(dtype), phase.sin().to(dtype), phase.cos().to(dtype)], -1)


@register("embedding", "learned_grid")
class LearnedGridEmbedding(nn.Module):
    """Learned features on a regular lattice, multilinearly interpolated at x: ``[B, N, Dx] -> [B, N, channels]``.

    A table of ``channels`` parameters per lattice point (``grid``: lower, upper, shape, optionally roll), read at
    each input by multilinear interpolation between the ``2^Dx`` surrounding points; inputs on a lattice point read
    its row exactly. It lets a model learn what is particular to each place at the lattice's resolution (sub-grid
    orography, coasts: what statistical downscaling fits per station), which smooth embeddings such as
    ``spherical_harmonics`` at L = 10 (wavelengths of thousands of km) cannot resolve. Combine the two with a
    ``composite`` embedding. Outside the lattice the nearest edge value holds (rolled dims wrap). Rows start as
    N(0, ``init_std``^2) codes, so every place is told apart from the first step.

    Args:
        dim_x: input dimension Dx; must equal the lattice's number of dimensions.
        grid: the lattice ``{lower: [...], upper: [...], shape: [...], roll: [...]}``, in input units.
        channels: features per lattice point (``out_dim``).
        init_std: standard deviation of the initial features; 0 starts from zeros.
        lr_scale: multiplies the table's effective learning rate under Adam-type optimisers (the table is stored
            divided by it and multiplied back in ``forward``): each row sees only the points near it, so it learns
            far more slowly than the shared weights at the same step size.
    """

    def __init__(
        self, dim_x: int, grid: dict[str, Any], channels: int = 16, init_std: float = 1.0, lr_scale: float = 1.0
    ) -> None:
        super().__init__()
        self.grid = as_grid(grid)
        if self.grid is None or self.grid.ndim != dim_x:
            raise ValueError(
                f"learned_grid: grid must be a lattice with one dimension per input dim ({dim_x}); got {grid!r}. "
                "Inside a composite embedding, dim_x is the number of the part's dims."
            )
        if channels < 1 or init_std < 0 or lr_scale <= 0:
            raise ValueError(
                f"learned_grid needs channels >= 1, init_std >= 0 and lr_scale > 0; got {channels}, {init_std}, "
                f"{lr_scale}."
            )
        self.lr_scale = float(lr_scale)
        self.table = nn.Parameter(torch.randn(self.grid.num_points, channels) * (init_std / self.lr_scale))
        corners = torch.cartesian_prod(*[torch.tensor([0, 1])] * dim_x).reshape(-1, dim_x)  # [2^Dx, Dx]
        self.register_buffer("corners", corners, persistent=False)
        self.out_dim = channels

    def forward(self, x: Tensor) -> Tensor:
        g = self.grid
        size = torch.tensor(g.shape, device=x.device)
        roll = torch.tensor(g.roll, device=x.device)
        dtype = torch.promote_types(x.dtype, torch.float32)  # never locate in bf16: 55.3 degrees is 55.25 there
        u = (x.to(dtype) - x.new_tensor(g.lower, dtype=dtype)) / x.new_tensor(g.spacing, dtype=dtype)
        # Lower corner: clamped so that (i0, i0 + 1) are both on an ordinary dimension; rolled dims wrap instead.
        i0 = torch.where(roll, u.floor(), u.floor().clamp(min=0).minimum(size - 2)).long()
        frac = torch.where(roll, u - u.floor(), (u - i0).clamp(0, 1))  # [B, N, Dx]
        index = i0.unsqueeze(-2) + self.corners  # [B, N, 2^Dx, Dx]
        index = torch.where(roll, torch.remainder(index, size), index)
        weight = torch.where(self.corners.bool(), frac.unsqueeze(-2), 1 - frac.unsqueeze(-2)).prod(-1)
        rows = self.table[g.flat_index(index)] * self.lr_scale  # [B, N, 2^Dx, channels]
        return (weight.unsqueeze(-1).to(rows.dtype) * rows).sum(-2).to(x.dtype)


@register("embedding", "composite")
class CompositeEmbedding(nn.Module):
    """Concatenated embeddings of chosen input dims: ``[B, N, Dx] -> [B, N, sum of the parts' out_dim]``.

    ``parts`` is a list of embedding specs, each with the input ``dims`` it embeds; a part is built with
    ``dim_x = len(dims)`` and sees those dims in the order given, e.g. for ``x = (time, lat, lon)``::

        {name: composite, parts: [{name: temporal, dims: [0]}, {name: spherical_harmonics, dims: [1, 2]}]}

    Every input dim must be used by some part (``{name: identity, dims: [...]}`` passes dims through raw);
    a dim may be used by several parts.

    Args:
        dim_x: input dimension Dx.
        parts: non-empty list of embedding specs ``{name: ..., dims: [...], ...}``, each with the input dims it embeds.
    """

    def __init__(self, dim_x: int, parts: list[dict[str, Any]]) -> None:
        super().__init__()
        if not isinstance(parts, list | tuple) or not parts:
            raise ValueError(
                "composite embedding needs a non-empty list of parts, e.g. parts: [{name: temporal, dims: [0]}, "
                f"{{name: spherical_harmonics, dims: [1, 2]}}]; got {parts!r}."
            )
        embeddings, indices = [], []
        for i, part in enumerate(parts):
            if not isinstance(part, dict) or "name" not in part or "dims" not in part:
                raise ValueError(
                    f"composite embedding part {i} must be a mapping with 'name' and 'dims', e.g. "
                    f"{{name: spherical_harmonics, dims: [1, 2]}}; got {part!r}."
                )
            spec = dict(part)
            dims, _ = _split_dims(dim_x, tuple(int(d) for d in spec.pop("dims")), f"composite part {i} dims")
            if spec.setdefault("dim_x", len(dims)) != len(dims):
                raise ValueError(f"composite part {i} sets dim_x = {spec['dim_x']} but has {len(dims)} dims {dims}.")
            embeddings.append(build_from_spec("embedding", spec))
            indices.append(dims)
        unused = sorted(set(range(dim_x)) - {d for dims in indices for d in dims})
        if unused:
            raise ValueError(
                f"composite embedding: input dims {unused} are used by no part; add "
                f"{{name: identity, dims: {unused}}} to pass them through raw."
            )
        self.parts = nn.ModuleList(embeddings)
        for i, dims in enumerate(indices):
            self.register_buffer(f"dims_{i}", torch.tensor(dims, dtype=torch.long), persistent=False)
        self.out_dim = sum(e.out_dim for e in embeddings)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([e(x.index_select(-1, getattr(self, f"dims_{i}"))) for i, e in enumerate(self.parts)], -1)
