"""Classical statistical baselines as grid decoders: ``mos`` and ``mos_kriging``.

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, 2 Dy]`` (mean, log variance),
read by the ``direct`` likelihood; reads the context set kept by the ``identity`` encoder, grid encoder and
processor (tokens = the values), like the ``interpolation`` baseline, and ignores ``zt``.

* ``mos``: model output statistics, a linear regression per place (per target location) on the gridded source's
  values around the target, with a Gaussian variance per place. Its coefficients are a learned table indexed by the
  target's nearest point of ``places``, so the normal training loop (Gaussian NLL, Adam) fits each place's least
  squares over every training task that has a target there.
* ``mos_kriging``: ``mos`` plus an exact Gaussian process on MOS's residuals at the context points of
  ``station_source``, interpolated to the targets (a gpytorch kernel, ``gridtnp.nn.conditioning``'s solve); the
  predictive variance is the GP's posterior variance plus the per-place MOS variance. The kernel's hyperparameters
  are learned by the same loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import gpytorch
import torch
from torch import Tensor, nn

from gridtnp.nn.conditioning import condition, dense_kernel, posterior
from gridtnp.nn.grid_decoders.gridded import gather_rows
from gridtnp.nn.grid_decoders.interpolation import check_final, source_axes
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.tokens import Latent
from gridtnp.registry import ConfigError, register


def stencil(radius: int, spacing: float, dim_x: int = 2) -> Tensor:
    """Offsets ``[(2 radius + 1)^dim_x, dim_x]`` of a square stencil, row-major, the centre at index ``S // 2``."""
    steps = [spacing * float(i) for i in range(-radius, radius + 1)]
    return torch.tensor(list(itertools.product(steps, repeat=dim_x)), dtype=torch.float32)


def stencil_values(xs: Tensor, ys: Tensor, mask: Tensor, xq: Tensor, offsets: Tensor) -> Tensor:
    """The nearest valid value of a source (``xs [B, N, d]``, ``ys [B, N]``, ``mask [B, N]``) at every point
    ``xq + offset`` (``xq [B, Nq, d]``, ``offsets [S, d]``) -> ``[B, Nq, S]`` (0 where the source has no point)."""
    b, nq, d = xq.shape
    query = (xq.detach().float().unsqueeze(-2) + offsets.to(xq.device)).reshape(b, nq * len(offsets), d)
    index, valid = knn_points(xs, mask, query, 1)
    values = gather_rows(ys.unsqueeze(-1), index)[..., 0, 0] * valid[..., 0]
    return values.view(b, nq, len(offsets))


def ridge_per_place(features: Tensor, y: Tensor, place: Tensor, places: int, ridge: float = 0.0) -> Tensor:
    """Closed-form ridge coefficients ``[P, F]`` per place: ``(X_p^T X_p + ridge I)^-1 X_p^T y_p`` over the rows
    of ``features [N, F]``, ``y [N]`` whose ``place [N]`` is ``p``. What the ``mos`` table converges to with no
    weight decay (``ridge = 0``), for checking a fitted table or starting one."""
    f = features.shape[-1]
    gram = features.new_zeros(places, f, f).index_add(0, place, features.unsqueeze(-1) * features.unsqueeze(-2))
    rhs = features.new_zeros(places, f).index_add(0, place, features * y.unsqueeze(-1))
    eye = ridge * torch.eye(f, dtype=features.dtype, device=features.device)
    return torch.linalg.solve(gram + eye, rhs.unsqueeze(-1))[..., 0]


class PlaceTable(nn.Module):
    """Rows of a learned table ``[P, C]`` at each point's nearest node of a rectilinear grid of places."""

    def __init__(self, places: Mapping[str, Any], init: Tensor, where: str) -> None:
        super().__init__()
        self.axes = source_axes(places, f"{where}, places")
        count = 1
        for a in self.axes:
            count *= int(a.numel())
        self.table = nn.Parameter(init.float().unsqueeze(0).repeat(count, 1))

    def index(self, x: Tensor) -> Tensor:
        """Flat index ``[B, N]`` of the nearest place of ``x [B, N, d]`` (clamped to the grid)."""
        flat = torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)
        for a, xd in zip(self.axes, x.detach().double().unbind(-1), strict=True):  # loop over dimensions
            a = a.to(x.device)
            nearest = torch.bucketize(xd.contiguous(), (a[1:] + a[:-1]) / 2) if a.numel() > 1 else flat * 0
            flat = flat * int(a.numel()) + nearest
        return flat

    def forward(self, x: Tensor) -> Tensor:
        """The rows ``[B, N, C]`` of the places nearest ``x [B, N, d]``."""
        return self.table[self.index(x)]


@register("grid_decoder", "mos")
class MOSDecoder(nn.Module):
    """Model output statistics: a per-place linear regression on the gridded values around each target.

    The regressors of a target at ``x`` are 1 and the nearest value of ``grid_source`` at each point ``x + o`` of a
    square stencil of offsets ``o`` (``(2 radius + 1)^2`` points ``spacing`` apart; with ``spacing`` the coarse
    grid's spacing these are the coarse blocks around the target, each coefficient tied to one offset). The mean is
    ``sum_f beta_{p f} x_f`` and the variance ``exp(log_var_p)``, both learned per place ``p``, the target's nearest
    node of ``places`` (a table, so one place's coefficients are fitted on every task with a target there). At the
    start the mean is the value at the centre of the stencil (the coarse cell's value). Output ``[B, Nt, 2]``: mean
    and log variance, for the ``direct`` likelihood. Needs the ``identity`` encoder, grid encoder and processor.

    Args:
        places: ``{lower, upper, shape}`` or ``{axes: [[...], ...]}``: the grid of places that own coefficients
            (e.g. the data's 0.25 degree points: each station snaps to its point).
        dim: output width, 2 (mean and log variance; the model's dim).
        in_dim: width of the context tokens (the ``identity`` encoder's ``dim_y``; passed by the model).
        sources: names of the context sources in the model's order (passed by the model).
        grid_source: the context source whose values are the regressors (the coarse grid).
        radius: stencil points each side of the target (1: 3 x 3).
        spacing: distance between stencil points, in the units of x (the coarse grid's spacing).
        init_variance: initial variance of every place.
        layers: must be 1 (the final state only); the model passes the processor's number of states.
    """

    kind = "mos"

    def __init__(
        self,
        places: Mapping[str, Any],
        dim: int = 2,
        in_dim: int | None = None,
        sources: Sequence[str] | None = None,
        grid_source: str = "grid",
        radius: int = 1,
        spacing: float = 1.0,
        init_variance: float = 1.0,
        layers: int = 1,
    ) -> None:
        super().__init__()
        name = f"grid decoder {self.kind!r}"
        check_final(self.kind, layers)
        self.sources = list(sources) if sources is not None else ["points"]
        if grid_source not in self.sources:
            raise ValueError(f"{name}: grid_source {grid_source!r} is not a context source: {self.sources}.")
        if dim != 2 or (in_dim is not None and in_dim != 1):
            raise ValueError(
                f"{name}: regresses one output on one-value tokens, so dim must be 2 (mean, log variance) and the "
                f"tokens 1 wide (encoder 'identity', dim_y 1); got dim {dim}, in_dim {in_dim}."
            )
        if radius < 0 or not spacing > 0 or not init_variance > 0:
            raise ValueError(f"{name}: needs radius >= 0, spacing > 0 and init_variance > 0.")
        self.grid_index = self.sources.index(grid_source)
        self.register_buffer("offsets", stencil(radius, spacing, len(places.get("shape", places.get("axes", [])))))
        init = torch.zeros(1 + len(self.offsets))
        init[1 + len(self.offsets) // 2] = 1.0  # the centre: the coarse cell's own value
        self.coef = PlaceTable(places, init, name)
        self.log_var = PlaceTable(places, torch.tensor([float(init_variance)]).log(), name)

    def check_box(self, box: Mapping[str, Any], data: str) -> None:
        """Refuse data whose targets (``box``: ``GridDataModule.target_box``) lie beyond the table of places by more
        than half a place: each would take the coefficients of the nearest edge place, fitted elsewhere."""
        axes, (lower, upper) = self.coef.axes, box["targets"]
        half = [0.5 * float(a[1] - a[0]) if a.numel() > 1 else 0.0 for a in axes]
        first, last = [float(a[0]) for a in axes], [float(a[-1]) for a in axes]
        inside = zip(first, last, half, lower, upper, strict=True)
        if all(a - h - 1e-6 <= lo and hi <= b + h + 1e-6 for a, b, h, lo, hi in inside):
            return
        names = box.get("axes") or [f"x{d}" for d in range(len(axes))]
        (grid_lo, grid_hi), step = box["grid"], [2 * h or 1.0 for h in half]
        shape = [round((hi - lo) / s) + 1 for lo, hi, s in zip(grid_lo, grid_hi, step, strict=True)]

        def span(lo: Sequence[float], hi: Sequence[float]) -> str:
            return ", ".join(f"{n} {a:g} to {b:g}" for n, a, b in zip(names, lo, hi, strict=True))

        raise ConfigError(
            f"grid decoder {self.kind!r}: its places cover {span(first, last)} but {data}'s targets lie at "
            f"{span(lower, upper)} (its grid: {span(grid_lo, grid_hi)}), where they would share the edge places' "
            "coefficients; set the recipe's grid_decoder places to the data's box, "
            f"{{lower: {[float(v) for v in grid_lo]}, upper: {[float(v) for v in grid_hi]}, shape: {shape}}}."
        )

    def context(self, states: list[Latent]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The context set: locations ``[B, N, d]``, values ``[B, N]``, mask ``[B, N]``, source ids ``[B, N]``."""
        state = states[-1]
        if state.grid is not None or state.mask is None:
            raise ValueError(
                f"grid decoder {self.kind!r} reads the context set: use encoder, grid encoder and processor 'identity'."
            )
        x, (z, mask) = state.locations(f"grid decoder {self.kind!r}"), state.as_set()
        source = state.source if state.source is not None else torch.zeros_like(mask, dtype=torch.long)
        return x, z[..., 0].float(), mask, source

    def features(self, x: Tensor, z: Tensor, mask: Tensor, source: Tensor, xq: Tensor) -> Tensor:
        """Regressors ``[B, Nq, F]`` at ``xq [B, Nq, d]``: 1 and the grid source's values on the stencil."""
        values = stencil_values(x, z, mask & (source == self.grid_index), xq, self.offsets)
        return torch.cat([torch.ones_like(values[..., :1]), values], -1)

    def regression(self, x: Tensor, z: Tensor, mask: Tensor, source: Tensor, xq: Tensor) -> Tensor:
        """MOS's mean ``[B, Nq]`` at ``xq [B, Nq, d]``."""
        return (self.features(x, z, mask, source, xq) * self.coef(xq)).sum(-1)

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        x, z, mask, source = self.context(states)
        mean = self.regression(x, z, mask, source, xt)
        return torch.stack([mean, self.log_var(xt)[..., 0]], -1).to(zt.dtype)


def gp_kernel(name: str, lengthscale: float, outputscale: float, where: str) -> gpytorch.kernels.ScaleKernel:
    """``ScaleKernel(RBF)`` or ``ScaleKernel(Matern nu)`` (``rbf``, ``matern12``, ``matern32``, ``matern52``)."""
    nus = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}
    if name == "rbf":
        base = gpytorch.kernels.RBFKernel()
    elif name in nus:
        base = gpytorch.kernels.MaternKernel(nu=nus[name])
    else:
        raise ValueError(f"{where}: kernel must be rbf, matern12, matern32 or matern52; got {name!r}.")
    base.lengthscale = lengthscale
    kernel = gpytorch.kernels.ScaleKernel(base)
    kernel.outputscale = outputscale
    return kernel


def gp_posterior(
    kernel: nn.Module, noise: Tensor, xc: Tensor, rc: Tensor, mask: Tensor, xt: Tensor
) -> tuple[Tensor, Tensor]:
    """Exact GP posterior mean and variance of the latent function ``[B, Nt]`` at ``xt [B, Nt, d]`` given residuals
    ``rc [B, N]`` at ``xc [B, N, d]`` observed with noise variance ``noise`` (a scalar tensor); padded points
    (``mask [B, N]`` False) carry no weight. Give float64 inputs: gpytorch's Matern kernels centre the points before
    taking distances, so a far-off (padded) point would cost float32 its precision at the others."""
    gram = dense_kernel(kernel, xc, xc)  # [B, N, N]
    factor = condition(gram, rc.unsqueeze(-1), mask, noise, "grid decoder 'mos_kriging'")
    shift, explained = posterior(factor, dense_kernel(kernel, xt, xc))
    prior = kernel(xt, diag=True)  # [B, Nt]
    return shift[..., 0], (prior - explained).clamp(min=0.0)


@register("grid_decoder", "mos_kriging")
class MOSKrigingDecoder(MOSDecoder):
    """``mos`` plus kriging of its residuals at the context stations: an exact GP posterior per task.

    MOS's residuals ``r_c = y_c - m(x_c)`` at the context points of ``station_source`` are interpolated to the
    targets by a zero-mean GP with kernel ``ScaleKernel(RBF or Matern)`` on x and Gaussian noise ``s^2``: mean
    ``m(x_t) + K_tc (K_cc + s^2 I)^-1 r_c``, variance ``k_tt - K_tc (K_cc + s^2 I)^-1 K_ct`` plus the per-place MOS
    variance. Lengthscale, output scale and noise are learned with the MOS table by the training loop. A task without
    context stations gets MOS with the GP prior variance added.

    Args:
        places: ``{lower, upper, shape}`` or ``{axes: [[...], ...]}``: the grid of places that own MOS coefficients.
        dim: output width, 2 (mean and log variance; the model's dim).
        in_dim: width of the context tokens (the ``identity`` encoder's ``dim_y``; passed by the model).
        sources: names of the context sources in the model's order (passed by the model).
        grid_source: the context source whose values are MOS's regressors (the coarse grid).
        station_source: the context source whose residuals are kriged (the stations).
        radius: stencil points each side of the target (1: 3 x 3).
        spacing: distance between stencil points, in the units of x (the coarse grid's spacing).
        init_variance: initial MOS variance of every place.
        kernel: ``rbf``, ``matern12``, ``matern32`` or ``matern52``.
        lengthscale: initial kernel lengthscale, in the units of x.
        outputscale: initial kernel output scale (prior variance of the residual field).
        noise: initial GP noise variance ``s^2`` at the context points.
        layers: must be 1 (the final state only); the model passes the processor's number of states.
    """

    kind = "mos_kriging"

    def __init__(
        self,
        places: Mapping[str, Any],
        dim: int = 2,
        in_dim: int | None = None,
        sources: Sequence[str] | None = None,
        grid_source: str = "grid",
        station_source: str = "stations",
        radius: int = 1,
        spacing: float = 1.0,
        init_variance: float = 1.0,
        kernel: str = "matern32",
        lengthscale: float = 0.5,
        outputscale: float = 0.5,
        noise: float = 0.1,
        layers: int = 1,
    ) -> None:
        super().__init__(places, dim, in_dim, sources, grid_source, radius, spacing, init_variance, layers)
        where = f"grid decoder {self.kind!r}"
        if station_source not in self.sources:
            raise ValueError(f"{where}: station_source {station_source!r} is not a context source: {self.sources}.")
        if not (lengthscale > 0 and outputscale > 0 and noise > 0):
            raise ValueError(f"{where}: lengthscale, outputscale and noise must be > 0.")
        self.station_index = self.sources.index(station_source)
        self.kernel = gp_kernel(kernel, lengthscale, outputscale, where)
        self.log_noise = nn.Parameter(torch.tensor(float(noise)).log())

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        x, z, mask, source = self.context(states)
        stations = mask & (source == self.station_index)
        residual = z - self.regression(x, z, mask, source, x)  # [B, N]; used at the stations only
        gp_mean, gp_var = gp_posterior(
            self.kernel, self.log_noise.exp().double(), x.double(), residual.double(), stations, xt.double()
        )
        mean = self.regression(x, z, mask, source, xt) + gp_mean.float()
        log_var = torch.logaddexp(self.log_var(xt)[..., 0], gp_var.float().clamp(min=1e-30).log())
        return torch.stack([mean, log_var], -1).to(zt.dtype)
