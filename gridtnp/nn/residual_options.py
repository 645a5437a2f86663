"""The typed options of the residual's interpolation (``gridtnp.nn.residuals``): its per-place regression on the
local shape of the interpolated sources (``regression:``) and its spreading of observation departures
(``departures:``). Each is a frozen dataclass that checks its own values when built; ``parse`` turns a recipe's
mapping into one (the boundary: recipes and jsonargparse pass plain mappings), and a one-line error names the key and
what it allows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

WHERE = "residual 'interpolation'"  # how error messages name the component

Options = TypeVar("Options", "Regression", "Departures")


def number(value: Any, what: str, positive: bool = True) -> float:
    """``value`` as a float, if it is a finite number (and > 0 with ``positive``); else a ValueError naming ``what``."""
    if (
        isinstance(value, bool)
        or not (isinstance(value, int | float) and math.isfinite(value))
        or (positive and value <= 0)
    ):
        raise ValueError(f"{WHERE}: {what} must be finite{' and > 0' if positive else ''}; got {value!r}.")
    return float(value)


def _integer(value: Any, what: str, low: int, high: int | None = None) -> int:
    """``value`` if it is an integer in ``[low, high]``; else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{WHERE}: {what} must be an integer {allowed}; got {value!r}.")
    return value


def _parse(cls: type[Options], value: Any, key: str, required: str, example: str) -> Options | None:
    """``value`` (None, an instance of ``cls`` or a recipe's mapping) as ``cls``, or a one-line error naming ``key``."""
    if value is None or isinstance(value, cls):
        return value
    names = [f.name for f in dataclasses.fields(cls)]
    allowed = f"{required} (required), " + ", ".join(n for n in names if n != required)
    if not isinstance(value, Mapping):
        raise ValueError(f"{WHERE}: {key} must be a mapping of {allowed} (e.g. {example}); got {value!r}.")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"{WHERE}: {key} has no option {unknown[0]!r}; allowed: {allowed}.")
    if required not in value:
        raise ValueError(f"{WHERE}: {key} needs {required!r} (e.g. {example}); got {dict(value)!r}.")
    return cls(**value)


@dataclass(frozen=True)
class Regression:
    """Per-place linear correction from the local shape of the coarse field (MOS-like).

    grid: lattice ``{lower, upper, shape}`` of the learned coefficients (a field over places).
    sources: interpolated sources whose neighbourhood shape is regressed on (None: the first one).
    lr_scale: learning-rate multiplier of the coefficient table.
    lengthscale: the shape's Gaussian weights, one or one per source (None: the interpolation's own, shared).
    degree: polynomial degree of the offsets' basis (1-4).
    position: degree of the basis in the target's position within its cell (0-4; 0: none).
    gain: also regress on the source's interpolated value itself (MOS's ``b x``), so a place can follow the
        surrounding field more or less strongly than one to one (a land station beside a sea block).
    """

    grid: Mapping[str, Any]
    sources: tuple[str, ...] | None = None
    lr_scale: float = 30.0
    lengthscale: float | Mapping[str, float] | None = None
    degree: int = 2
    position: int = 0
    gain: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.grid, Mapping):
            raise ValueError(f"{WHERE}: regression.grid must be a mapping {{lower, upper, shape}}; got {self.grid!r}.")
        sources = self.sources
        if sources is not None:
            sources = (sources,) if isinstance(sources, str) else tuple(sources)
            if not sources or not all(isinstance(s, str) for s in sources):
                raise ValueError(f"{WHERE}: regression.sources must be a list of source names; got {self.sources!r}.")
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "lr_scale", number(self.lr_scale, "regression.lr_scale"))
        object.__setattr__(self, "degree", _integer(self.degree, "regression.degree", 1, 4))
        object.__setattr__(self, "position", _integer(self.position, "regression.position", 0, 4))
        if not isinstance(self.gain, bool):
            raise ValueError(f"{WHERE}: regression.gain must be true or false; got {self.gain!r}.")
        scale = self.lengthscale
        if isinstance(scale, Mapping):
            scale = {s: number(v, f"regression.lengthscale of {s!r}") for s, v in scale.items()}
        elif scale is not None:
            scale = number(scale, "regression.lengthscale of every source")
        object.__setattr__(self, "lengthscale", scale)

    @classmethod
    def parse(cls, value: Regression | Mapping[str, Any] | None) -> Regression | None:
        """A recipe's ``regression:`` mapping (or an instance, or None) as ``Regression``."""
        example = "{sources: [grid], grid: {lower: [...], upper: [...], shape: [...]}, lr_scale: 30}"
        return _parse(cls, value, "regression", "grid", example)

    def for_sources(self, interpolated: list[str]) -> Regression:
        """These options with ``sources`` and ``lengthscale`` resolved (``{source: l}`` or None) against the
        ``interpolated`` sources of the residual."""
        sources = self.sources if self.sources is not None else tuple(interpolated[:1])
        if set(sources) - set(interpolated):
            raise ValueError(
                f"{WHERE}: regression.sources must be some of the interpolated sources {interpolated}; got "
                f"{list(sources)!r}."
            )
        scale = self.lengthscale
        scales = dict(scale) if isinstance(scale, Mapping) else None if scale is None else dict.fromkeys(sources, scale)
        if scales is not None and set(scales) != set(sources):
            raise ValueError(
                f"{WHERE}: regression.lengthscale must be one number or one per source {list(sources)}; got {scale!r}."
            )
        return dataclasses.replace(self, sources=sources, lengthscale=scales)


@dataclass(frozen=True)
class Departures:
    """Observation departures from the interpolation, spread to the targets by a learned kernel.

    source: the context source whose departures are spread (not an interpolated one).
    k: nearest observations per target.
    lengthscale, weight: the kernel's starting length-scale and weight.
    """

    source: str
    k: int = 8
    lengthscale: float = 0.5
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise ValueError(f"{WHERE}: departures.source must be a context source's name; got {self.source!r}.")
        object.__setattr__(self, "k", _integer(self.k, "departures.k", 1))
        object.__setattr__(self, "lengthscale", number(self.lengthscale, "departures.lengthscale"))
        object.__setattr__(self, "weight", number(self.weight, "departures.weight"))

    @classmethod
    def parse(cls, value: Departures | Mapping[str, Any] | None) -> Departures | None:
        """A recipe's ``departures:`` mapping (or an instance, or None) as ``Departures``."""
        return _parse(cls, value, "departures", "source", "{source: stations, k: 8, lengthscale: 0.5}")

    def check_source(self, interpolated: list[str], source_dims: dict[str, int], dim_y: int) -> None:
        """Refuse a ``source`` that the model lacks, that is interpolated, or that has fewer than ``dim_y`` values."""
        if self.source not in source_dims or self.source in interpolated:
            raise ValueError(
                f"{WHERE}: departures.source must be a context source {sorted(source_dims)} not among the "
                f"interpolated sources {interpolated}; got {self.source!r}."
            )
        if source_dims[self.source] < dim_y:
            raise ValueError(f"{WHERE}: departures.source {self.source!r} has fewer value columns than Dy = {dim_y}.")


__all__ = ["Departures", "Regression", "number"]
