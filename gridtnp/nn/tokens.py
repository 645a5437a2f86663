"""Containers for what flows between the pipeline stages.

``Tokens``: embedded observations of one source, ``x [B, N, Dx]``, ``z [B, N, D]``, ``mask [B, N]``.
``Latent``: what a grid encoder produces and a processor updates: either tokens on a regular grid
``[B, M1, ..., Md, D]`` (``grid`` set, ``mask``/``x`` None) or a padded set ``[B, N, D]`` with its
``mask [B, N]`` and, where known, locations ``x [B, N, Dx]`` and the context source of each token
``source [B, N]`` (an index into the model's source names, set by the ``identity`` grid encoder).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from gridtnp.nn.grids import Grid


@dataclass
class Tokens:
    """Embedded observations of one source: ``x [B, N, Dx]``, ``z [B, N, D]``, ``mask [B, N]``."""

    x: Tensor
    z: Tensor
    mask: Tensor


def nothing_masked(mask: Tensor) -> bool:
    """Whether ``mask`` is all True, answered only where that is free: on the CPU outside ``torch.compile``.

    On a GPU the answer would cost a device sync, and under ``torch.compile`` a graph break, so there it is False
    (the caller keeps its masked path).
    """
    return mask.device.type == "cpu" and not torch.compiler.is_compiling() and bool(mask.all())


def zero_padding(z: Tensor, mask: Tensor) -> Tensor:
    """``z [B, N, D]`` with the padded points (``mask [B, N]`` False, whose values may be NaN) set to zero.

    Without padding ``z`` itself is returned where that check is free (``nothing_masked``): a full-size copy saved.
    """
    return z if nothing_masked(mask) else torch.where(mask.unsqueeze(-1), z, 0.0)


def concat_sources(sources: dict[str, Tokens]) -> Tokens:
    """Union of all sources' tokens along the point axis: ``[B, sum N_s, D]``."""
    if len(sources) == 1:
        return next(iter(sources.values()))
    items = list(sources.values())
    return Tokens(
        torch.cat([t.x for t in items], 1), torch.cat([t.z for t in items], 1), torch.cat([t.mask for t in items], 1)
    )


@dataclass
class Latent:
    """Pseudo-tokens: on a grid ``[B, M1..Md, D]`` (``grid``) or a set ``[B, N, D]`` (``mask``, ``x``, ``source``)."""

    tokens: Tensor
    mask: Tensor | None = None
    x: Tensor | None = None
    grid: Grid | None = None
    source: Tensor | None = None

    def with_tokens(self, tokens: Tensor) -> Latent:
        """The same latent with new tokens of the same layout."""
        return replace(self, tokens=tokens)

    def flat(self) -> tuple[Tensor, Tensor | None]:
        """Tokens as a set ``[B, M, D]`` (grids flattened row-major) and the key mask ``[B, M]`` or None."""
        t = self.tokens
        return t.reshape(t.shape[0], -1, t.shape[-1]), self.mask

    def as_set(self) -> tuple[Tensor, Tensor]:
        """``flat()`` with a mask ``[B, M]`` that is all True when the latent has none."""
        z, mask = self.flat()
        return z, torch.ones(z.shape[:2], dtype=torch.bool, device=z.device) if mask is None else mask

    def locations(self, where: str) -> Tensor:
        """The tokens' locations ``x [B, M, Dx]``; ``where`` names the component that needs them in the error."""
        if self.x is None:
            raise ValueError(
                f"{where} needs the tokens' locations (Latent.x); use grid encoder 'identity', which keeps them, "
                "and a TE processor."
            )
        return self.x


def last_states(states: list[Latent], layers: int, name: str) -> list[Latent]:
    """The last ``layers`` states, with a clear error if the processor produced fewer."""
    if len(states) < layers:
        raise ValueError(
            f"grid decoder {name!r} has {layers} blocks but the processor produced {len(states)} state(s); "
            f"set the decoder's layers <= the processor's layers."
        )
    return states[len(states) - layers :]


def check_width(t: Tokens, in_dim: int, name: str) -> None:
    """A clear error when the context tokens are not ``in_dim`` wide."""
    if t.z.shape[-1] != in_dim:
        raise ValueError(
            f"grid encoder {name!r} was built with in_dim={in_dim} but got context tokens of width {t.z.shape[-1]}; "
            "set in_dim to the point-wise encoder's output width."
        )
