"""The identity grid encoder: the context tokens themselves as the set ``Latent`` (grid-free models)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gridtnp.nn.tokens import Latent, Tokens, concat_sources
from gridtnp.registry import register


@register("grid_encoder", "identity")
class IdentityGridEncoder(nn.Module):
    """Grid-free models (CNP, TNP, PT-TNP): the union of all sources' tokens as a masked set ``[B, N, D]``.

    The latent keeps the locations ``x [B, N, Dx]`` and, in ``source [B, N]``, which context source each token came
    from (its index in ``sources``; for decoders that treat sources apart, such as ``interpolation``).

    Args:
        sources: names of the context sources in the model's order (passed by the model); null: the context's order.
    """

    def __init__(self, sources: Sequence[str] | None = None) -> None:
        super().__init__()
        self.sources = None if sources is None else list(sources)

    def forward(self, sources: dict[str, Tokens]) -> Latent:
        t = concat_sources(sources)
        names = self.sources or list(sources)
        unknown = sorted(set(sources) - set(names))
        if unknown:
            raise ValueError(f"grid encoder 'identity': context source(s) {unknown} are not among {names}.")
        ids = torch.cat([torch.full(s.mask.shape, names.index(n), device=s.mask.device) for n, s in sources.items()], 1)
        return Latent(t.z, mask=t.mask, x=t.x, source=ids)
