"""Sawtooth tasks (ConvCNP paper, Gordon et al., 2020) in 1-D and 2-D.

A truncated Fourier series of a sawtooth wave of amplitude ``A``, frequency ``f`` and shift ``s``:

    y(u) = A / 2 - A / pi * sum_{k=1}^{K} (-1)^k sin(2 pi k f (u + s)) / k

with ``f ~ U[3, 5]``, ``s ~ U[-5, 5]``, ``K ~ U{10..20}`` per task and ``A = 1`` (the ConvCNP generator). In 1-D
``u = x``; in 2-D ``u = x · d`` for a unit direction ``d``: any direction for ``sawtooth2d``, one of
``±(1, 1)/sqrt2, ±(1, -1)/sqrt2`` for ``sawtooth2d_restricted`` (any direction with ``test_rotated=True``). In 2-D,
``rotation`` (degrees) turns every direction by a fixed angle: a restricted task with ``rotation: 22.5`` has only
directions that training on the diagonals never saw (the rotated test tasks for rotation-equivariant models).
Optional Gaussian observation noise (``noise``, default 0 as in ConvCNP).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gridtnp.batch import DEFAULT_SOURCE, Batch, Observations
from gridtnp.data.tasks import check_positive, check_range, check_sizes, random_sizes, uniform, zero_padding
from gridtnp.registry import ConfigError, register


def sawtooth(u: Tensor, frequency: Tensor, shift: Tensor, terms: Tensor, max_terms: int, amplitude: float) -> Tensor:
    """The truncated sawtooth series ``[B, N]`` at ``u [B, N]``, per-task ``frequency``, ``shift``, ``terms [B]``."""
    k = torch.arange(1, max_terms + 1, dtype=u.dtype)  # [K]
    coef = torch.where(k <= terms[:, None], (-1.0) ** k / k, torch.zeros(()))  # [B, K]; 0 beyond each task's K
    phase = 2 * math.pi * k * (frequency[:, None, None] * (u + shift[:, None])[..., None])  # [B, N, K]
    return amplitude / 2 - amplitude / math.pi * (torch.sin(phase) * coef[:, None, :]).sum(-1)


class _Sawtooth:
    """Shared sampling for the sawtooth tasks; subclasses choose the input dimension, the directions and the
    default set sizes (``None`` takes them).

    Args:
        min_context: fewest context points of a task.
        max_context: most context points of a task (null: 64 in 1-D, 256 in 2-D).
        num_targets: target points per task (null: 128 in 1-D, 256 in 2-D).
        context_range: ``(low, high)`` of the context x along each dimension, drawn uniformly.
        target_range: ``(low, high)`` of the target x along each dimension, drawn uniformly.
        frequency_range: range of the wave's frequency, drawn uniformly per task.
        shift_range: range of the wave's phase shift, drawn uniformly per task.
        min_terms: fewest Fourier terms of the truncated sawtooth series.
        max_terms: most Fourier terms of the truncated sawtooth series.
        amplitude: peak-to-peak amplitude of the wave.
        noise: standard deviation of the Gaussian observation noise.
    """

    name = "sawtooth"
    dim_x = 1
    default_max_context = 64
    default_num_targets = 128

    def __init__(
        self,
        min_context: int = 1,
        max_context: int | None = None,
        num_targets: int | None = None,
        context_range: tuple[float, float] = (-2.0, 2.0),
        target_range: tuple[float, float] = (-2.0, 2.0),
        frequency_range: tuple[float, float] = (3.0, 5.0),
        shift_range: tuple[float, float] = (-5.0, 5.0),
        min_terms: int = 10,
        max_terms: int = 20,
        amplitude: float = 1.0,
        noise: float = 0.0,
    ) -> None:
        name = self.name
        max_context = self.default_max_context if max_context is None else max_context
        num_targets = self.default_num_targets if num_targets is None else num_targets
        check_sizes(name, "min_context", min_context, "max_context", max_context)
        check_sizes(name, "num_targets", num_targets, "num_targets", num_targets, smallest=1)
        check_sizes(name, "min_terms", min_terms, "max_terms", max_terms, smallest=1)
        self.context_range = check_range(name, "context_range", context_range)
        self.target_range = check_range(name, "target_range", target_range)
        self.frequency_range = check_range(name, "frequency_range", frequency_range, allow_equal=True)
        self.shift_range = check_range(name, "shift_range", shift_range, allow_equal=True)
        self.amplitude = check_positive(name, "amplitude", amplitude)
        self.noise = check_positive(name, "noise", noise, allow_zero=True)
        self.min_context, self.max_context, self.num_targets = min_context, max_context, num_targets
        self.min_terms, self.max_terms = min_terms, max_terms
        self.dim_y = {DEFAULT_SOURCE: 1}
        self.target_dim_y = 1

    def directions(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Unit directions ``[B, dim_x]`` along which each task's wave varies."""
        return torch.ones(batch_size, 1)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` tasks: context ``x [B, N_c, Dx]`` (padded, masked), targets ``x [B, N_t, Dx]``."""
        g, b, d = generator, batch_size, self.dim_x
        frequency = uniform((b,), *self.frequency_range, g)
        shift = uniform((b,), *self.shift_range, g)
        terms = torch.randint(self.min_terms, self.max_terms + 1, (b,), generator=g)
        direction = self.directions(b, g)
        _, mask_c = random_sizes(b, self.min_context, self.max_context, g)
        nc, nt = mask_c.shape[1], self.num_targets
        x = torch.cat([uniform((b, nc, d), *self.context_range, g), uniform((b, nt, d), *self.target_range, g)], 1)
        u = (x * direction[:, None, :]).sum(-1)
        y = sawtooth(u, frequency, shift, terms, self.max_terms, self.amplitude)
        y = (y + self.noise * torch.randn(b, nc + nt, generator=g))[..., None]
        context = Observations(zero_padding(x[:, :nc], mask_c), zero_padding(y[:, :nc], mask_c), mask_c, "context")
        target = Observations(x[:, nc:], y[:, nc:], torch.ones(b, nt, dtype=torch.bool), "target")
        return Batch({DEFAULT_SOURCE: context}, target)


@register("task", "sawtooth1d")
class Sawtooth1D(_Sawtooth):
    """1-D sawtooth waves (ConvCNP): random frequency, shift and number of Fourier terms per task."""

    name = "sawtooth1d"


@register("task", "sawtooth2d")
class Sawtooth2D(_Sawtooth):
    """2-D sawtooth waves ``y(x · d)`` with a uniformly random unit direction ``d`` per task; ``x ~ U[range]^2``."""

    name = "sawtooth2d"
    dim_x = 2
    default_max_context = 256
    default_num_targets = 256

    def __init__(self, rotation: float = 0.0, **kwargs: Any) -> None:
        """The arguments of ``sawtooth1d`` and:

        Args:
            rotation: angle in degrees added to every task's direction.
        """
        if isinstance(rotation, bool) or not isinstance(rotation, (int, float)):
            raise ConfigError(f"{self.name}: rotation must be an angle in degrees; got {rotation!r}.")
        super().__init__(**kwargs)
        self.rotation = math.radians(float(rotation))

    def angles(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Uniformly random angles ``[B]`` in radians."""
        return uniform((batch_size,), 0.0, 2 * math.pi, generator)

    def directions(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Unit directions ``[B, 2]`` at ``angles + rotation``."""
        angle = self.angles(batch_size, generator) + self.rotation
        return torch.stack([angle.cos(), angle.sin()], -1)


@register("task", "sawtooth2d_restricted")
class Sawtooth2DRestricted(Sawtooth2D):
    """2-D sawtooth waves along the diagonals only (``d = ±(1, 1)/sqrt2, ±(1, -1)/sqrt2``); rotated test variants.

    ``test_rotated=True`` draws any direction, ``rotation`` turns the diagonals by a fixed angle (degrees).
    """

    name = "sawtooth2d_restricted"

    def __init__(self, test_rotated: bool = False, **kwargs: Any) -> None:
        """The arguments of ``sawtooth2d`` (``rotation``, ...) and:

        Args:
            test_rotated: draw any direction instead of the diagonals (the rotated test tasks).
        """
        if not isinstance(test_rotated, bool):
            raise ConfigError(f"{self.name}: test_rotated must be true or false; got {test_rotated!r}.")
        super().__init__(**kwargs)
        self.test_rotated = test_rotated

    def angles(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Diagonal angles ``[B]`` (pi/4 + k pi/2), or any angle when ``test_rotated``."""
        if self.test_rotated:
            return super().angles(batch_size, generator)
        return math.pi / 4 + math.pi / 2 * torch.randint(4, (batch_size,), generator=generator).float()
