"""Multi-source grid encoder: one inner encoder and grid per source, merged into one grid."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gridtnp.nn.grids import (
    Grid,
)
from gridtnp.nn.tokens import Latent, Tokens
from gridtnp.registry import build_from_spec, register


@register("grid_encoder", "multi")
class MultiSourceGridEncoder(nn.Module):
    """One inner grid encoder (and grid) per source, merged into one grid: ``Latent([B, M1..Md, dim])``.

    ``sources`` names the context sources; the model builder passes the model's sources unless the spec sets them:
    ``{name: multi, sources: [era5, stations], encoder: {name: pseudo_token}, merge: concat}``. ``encoder`` is one
    spec for every source or a mapping ``{source: spec}``. ``merge="sum"`` adds the grids; ``"concat"`` stacks
    them along the channels (in ``sources`` order) and applies a Linear back to ``dim``. A source missing from
    the input counts as having no observations. (The default elsewhere, "single", unions all sources' tokens
    into one encoder.)

    Args:
        grid: the model's grid (passed by the model), given to every inner encoder.
        sources: distinct names of the context sources (no '.'), one inner encoder each, in ``concat`` order.
        dim: token width D of the grid tokens (every inner encoder's ``dim``).
        in_dim: width of the context tokens, given to every inner encoder; null for ``dim``.
        encoder: inner grid encoder spec (or name) for all sources, or ``{source: spec}``; null for ``pseudo_token``.
        merge: ``concat`` (stack along the channels, then a Linear to ``dim``) or ``sum`` (add the grids).
    """

    def __init__(
        self,
        grid: Grid,
        sources: Sequence[str],
        dim: int = 128,
        in_dim: int | None = None,
        encoder: dict[str, Any] | str | None = None,
        merge: str = "concat",
    ) -> None:
        super().__init__()
        where = "grid encoder 'multi'"
        if isinstance(sources, str) or not sources or len(set(sources)) != len(sources):
            raise ValueError(f"{where}: sources must be a list of distinct source names; got {sources!r}.")
        if any("." in s or not s for s in sources):
            raise ValueError(f"{where}: source names must be non-empty and contain no '.'; got {list(sources)}.")
        if merge not in ("sum", "concat"):
            raise ValueError(f"{where}: merge must be 'sum' or 'concat'; got {merge!r}.")
        spec = {"name": "pseudo_token"} if encoder is None else encoder
        per_source = isinstance(spec, dict) and "name" not in spec
        if per_source and set(spec) != set(sources):
            raise ValueError(
                f"{where}: encoder must be one spec {{name: ...}} or one per source {sorted(sources)}; "
                f"got keys {sorted(spec)}."
            )
        self.sources, self.merge = list(sources), merge
        in_dim = dim if in_dim is None else in_dim
        self.encoders = nn.ModuleDict(
            {
                s: build_from_spec("grid_encoder", spec[s] if per_source else spec, grid=grid, dim=dim, in_dim=in_dim)
                for s in self.sources
            }
        )
        grids = {getattr(e, "grid", None) for e in self.encoders.values()}
        if len(grids) != 1:
            raise ValueError(f"{where}: the inner encoders write to different grids {grids}; give them one coarsen.")
        # The grid the processor and decoder are built for (the model reads it): a coarse one with ``coarsen``.
        self.grid = grids.pop()
        self.proj = nn.Linear(len(self.sources) * dim, dim) if merge == "concat" else nn.Identity()

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        unknown = set(sources) - set(self.sources)
        if unknown:
            raise ValueError(
                f"grid encoder 'multi' got source(s) {sorted(unknown)} it was not built for; its sources: "
                f"{self.sources}. Add them to the spec's sources list."
            )
        if not sources:
            raise ValueError("grid encoder 'multi' needs at least one source in its input.")
        ref = next(iter(sources.values()))
        empty = Tokens(ref.x[:, :0], ref.z[:, :0], ref.mask[:, :0])
        latents = [self.encoders[s]({s: sources.get(s, empty)}) for s in self.sources]  # loop over sources
        grid = latents[0].grid
        if any(lat.grid != grid or lat.tokens.shape != latents[0].tokens.shape for lat in latents):
            raise ValueError(
                "grid encoder 'multi': the inner encoders produced different grids "
                f"{[lat.grid for lat in latents]}; give them the same coarsen and dim."
            )
        if self.merge == "sum":
            tokens = torch.stack([lat.tokens for lat in latents]).sum(0)
        else:
            tokens = self.proj(torch.cat([lat.tokens for lat in latents], dim=-1))
        return Latent(tokens, grid=grid)
