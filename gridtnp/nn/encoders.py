"""Point-wise encoders: one observation ``(x, y)`` -> one token, independently per point.

Context tokens embed ``cat[embed(x), y, 0]``; target tokens embed ``cat[embed(x), 0, 1]`` with the
same network (TNP convention: the last entry flags "value unknown").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import mlp
from gridtnp.registry import build_from_spec, register


@register("encoder", "mlp")
class MLPEncoder(nn.Module):
    """MLP on ``cat[embed(x), y, flag]``: ``x [B, N, Dx]``, ``y [B, N, Dy] | None`` -> ``[B, N, D]``."""

    def __init__(
        self,
        dim_x: int,
        dim_y: int,
        dim: int = 128,
        hidden: int | None = None,
        layers: int = 3,
        embed: dict[str, Any] | str = "identity",
    ) -> None:
        super().__init__()
        self.dim_y = dim_y
        self.embed = build_from_spec("embedding", embed, dim_x=dim_x)
        self.net = mlp(self.embed.out_dim + dim_y + 1, dim, hidden or dim, layers)
        self.out_dim = dim

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        e = self.embed(x)
        if y is None:
            y = e.new_zeros(*e.shape[:-1], self.dim_y)
            flag = e.new_ones(*e.shape[:-1], 1)
        else:
            flag = e.new_zeros(*e.shape[:-1], 1)
        return self.net(torch.cat([e, y.to(e.dtype), flag], dim=-1))


@register("encoder", "identity")
class IdentityEncoder(nn.Module):
    """The values themselves as tokens (ConvCNP): ``y [B, N, Dy] -> [B, N, Dy]``; targets get zeros."""

    def __init__(self, dim_y: int) -> None:
        super().__init__()
        self.dim_y = dim_y
        self.out_dim = dim_y

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        return x.new_zeros(*x.shape[:-1], self.dim_y) if y is None else y.to(x.dtype)
