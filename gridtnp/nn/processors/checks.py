"""Argument checks shared by the processors, each failing with a message that says what is allowed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from gridtnp.nn.grids import Grid


def check_layers(name: str, layers: int) -> None:
    """``layers >= 1`` for processor ``name``."""
    if layers < 1:
        raise ValueError(f"processor {name!r}: layers must be >= 1; got {layers}.")


def per_dim(name: str, key: str, value: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """One int per grid dimension from an int or a list of ``ndim`` ints."""
    values = (int(value),) * ndim if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != ndim:
        raise ValueError(
            f"processor {name!r}: {key} must be one int or {ndim} ints (one per grid dimension); got {value!r}."
        )
    return values


def check_multiple(name: str, key: str, shape: Sequence[int], factor: Sequence[int]) -> None:
    """Raise if a grid size is not a multiple of ``factor`` along some dimension, naming the allowed sizes."""
    for d, (size, f) in enumerate(zip(shape, factor, strict=True)):
        if size % f:
            near = sorted({max(f, size // f * f), math.ceil(size / f) * f})
            raise ValueError(
                f"processor {name!r}: grid dimension {d} has {size} points, which is not a multiple of the {key} "
                f"{f} along it; allowed sizes are multiples of {f} (e.g. {' or '.join(map(str, near))}). Change "
                f"the grid shape or the {key}."
            )


def check_grid_tokens(name: str, grid: Grid, tokens: Tensor) -> None:
    """Tokens ``[B, M1..Md, D]`` on ``grid``, else an error naming the expected shape."""
    if tuple(tokens.shape[1:-1]) != grid.shape:
        raise ValueError(
            f"processor {name!r} was built for grid shape {list(grid.shape)} but got tokens {tuple(tokens.shape)}; "
            f"expected [B, {', '.join(map(str, grid.shape))}, D] from a grid encoder on the same grid."
        )
