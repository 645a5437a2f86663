"""The typed options of the residual's interpolation (``gridtnp.nn.residuals``): its per-place regression on the
local shape of the interpolated sources (``regression:``) and its spreading of observation departures
(``departures:``). Each parses the recipe's mapping once, fills its defaults and says what is wrong in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WHERE = "residual 'interpolation'"  # how error messages name the component


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


@dataclass(frozen=True)
class Regression:
    """Per-place linear correction from the local shape of the coarse field (MOS-like).

    sources: interpolated sources whose neighbourhood shape is regressed on.
    grid: lattice ``{lower, upper, shape}`` of the learned coefficients (a field over places).
    lr_scale: learning-rate multiplier of the coefficient table.
    lengthscale: the shape's Gaussian weights per source (None: the interpolation's own, shared).
    degree: polynomial degree of the offsets' basis (1-4).
    position: degree of the basis in the target's position within its cell (0-4; 0: none).
    """

    sources: tuple[str, ...]
    grid: dict[str, Any]
    lr_scale: float = 30.0
    lengthscale: dict[str, float] | None = None
    degree: int = 2
    position: int = 0

    @classmethod
    def from_spec(cls, spec: Any, interpolated: list[str]) -> Regression:
        """The checked options of a recipe's ``regression:`` mapping, for the interpolated ``sources``."""
        allowed = {"sources", "grid", "lr_scale", "lengthscale", "degree", "position"}
        if not isinstance(spec, dict) or "grid" not in spec or set(spec) - allowed:
            raise ValueError(
                f"{WHERE}: regression must be a mapping with 'grid' (the lattice of its coefficients) and optionally "
                f"sources, lr_scale, lengthscale, degree and position (e.g. {{sources: [grid], grid: {{lower: [...], "
                f"upper: [...], shape: [...]}}, lr_scale: 30, lengthscale: 0.75}}); got {spec!r}."
            )
        sources = spec.get("sources", interpolated[:1])
        sources = [sources] if isinstance(sources, str) else list(sources)
        if not sources or set(sources) - set(interpolated):
            raise ValueError(
                f"{WHERE}: regression.sources must be some of the interpolated sources {interpolated}; got {sources!r}."
            )
        lengthscale = None
        if "lengthscale" in spec:
            scale = spec["lengthscale"]
            scales = dict(scale) if isinstance(scale, dict) else dict.fromkeys(sources, scale)
            if set(scales) != set(sources):
                raise ValueError(
                    f"{WHERE}: regression.lengthscale must be one number or one per source {sources}; got {scale!r}."
                )
            lengthscale = {s: number(v, f"regression.lengthscale of {s!r}") for s, v in scales.items()}
        return cls(
            sources=tuple(sources),
            grid=spec["grid"],
            lr_scale=number(spec.get("lr_scale", cls.lr_scale), "regression.lr_scale"),
            lengthscale=lengthscale,
            degree=_integer(spec.get("degree", cls.degree), "regression.degree", 1, 4),
            position=_integer(spec.get("position", cls.position), "regression.position", 0, 4),
        )


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

    @classmethod
    def from_spec(cls, spec: Any, interpolated: list[str], source_dims: dict[str, int], dim_y: int) -> Departures:
        """The checked options of a recipe's ``departures:`` mapping."""
        allowed = {"source", "k", "lengthscale", "weight"}
        if not isinstance(spec, dict) or "source" not in spec or set(spec) - allowed:
            raise ValueError(
                f"{WHERE}: departures must be a mapping with 'source' and optionally k, lengthscale, weight "
                f"(e.g. {{source: stations, k: 8, lengthscale: 0.5}}); got {spec!r}."
            )
        source = spec["source"]
        if source not in source_dims or source in interpolated:
            raise ValueError(
                f"{WHERE}: departures.source must be a context source {sorted(source_dims)} not among the "
                f"interpolated sources {interpolated}; got {source!r}."
            )
        if source_dims[source] < dim_y:
            raise ValueError(f"{WHERE}: departures.source {source!r} has fewer value columns than Dy = {dim_y}.")
        return cls(
            source=source,
            k=_integer(spec.get("k", cls.k), "departures.k", 1),
            lengthscale=number(spec.get("lengthscale", cls.lengthscale), "departures.lengthscale"),
            weight=number(spec.get("weight", cls.weight), "departures.weight"),
        )


__all__ = ["Departures", "Regression", "number"]
