"""Point-wise encoders: one observation ``(x, y)`` -> one token, independently per point.

Interface: ``encoder(x [B, N, Dx], y [B, N, Dy] | None) -> z [B, N, out_dim]``; ``y = None`` encodes target
locations. Every encoder has ``dim_y`` and ``out_dim`` attributes; the model builds one encoder per context source
and embeds the targets with the target source's encoder.

* ``mlp``: ``MLP(cat[embed(x), y, 0])`` for context, ``MLP(cat[embed(x), 0, 1])`` for targets (TNP convention: the
  last entry flags "value unknown").
* ``identity``: the values themselves (ConvCNP).
* ``value``: values only, no location (TE-TNPs: locations reach the model only through differences).
* ``additive``: ``phi(embed(x)) + nu(y)`` (MSA, TFS).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.mlp import mlp
from gridtnp.registry import build_from_spec, register


@register("encoder", "mlp")
class MLPEncoder(nn.Module):
    """MLP on ``cat[embed(x), y, flag]``: ``x [B, N, Dx]``, ``y [B, N, Dy] | None`` -> ``[B, N, D]``.

    Args:
        dim_x: input dimension Dx.
        dim_y: output dimension Dy of the source it embeds (targets get zeros in its place).
        dim: token width D (the MLP's output width).
        hidden: hidden width of the MLP; null for ``dim``.
        layers: number of linear layers of the MLP (``layers - 1`` hidden layers).
        embed: embedding of ``x`` before the MLP, a name or ``{name: ..., ...}`` spec (see ``gridtnp list embedding``).
    """

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


TARGET_INITS = ("learned", "random")


@register("encoder", "value")
class ValueEncoder(nn.Module):
    """Tokens from values only (TE-TNP): context ``MLP(cat[y, 0])``, targets ``MLP(cat[0, 1])``; ``x`` is ignored.

    ``x [B, N, Dx]``, ``y [B, N, Dy] | None`` -> ``[B, N, D]``. Every target starts from the same learned token
    (``target_init="learned"``) or from fresh standard-normal noise at each call (``"random"``, which makes
    predictions random too); TE blocks then tell targets apart by their locations relative to the context.

    Args:
        dim_y: output dimension Dy of the source it embeds.
        dim: token width D (the MLP's output width).
        hidden: hidden width of the MLP; null for ``dim``.
        layers: number of linear layers of the MLP (``layers - 1`` hidden layers).
        target_init: target tokens: ``learned`` (the MLP of ``cat[0, 1]``) or ``random`` (standard normal, per call).
    """

    def __init__(
        self, dim_y: int, dim: int = 128, hidden: int | None = None, layers: int = 3, target_init: str = "learned"
    ) -> None:
        super().__init__()
        if target_init not in TARGET_INITS:
            raise ValueError(f"encoder 'value': target_init must be one of {TARGET_INITS}; got {target_init!r}.")
        self.dim_y, self.out_dim, self.target_init = dim_y, dim, target_init
        self.net = mlp(dim_y + 1, dim, hidden or dim, layers)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        shape = x.shape[:-1]
        if y is None:
            if self.target_init == "random":
                return torch.randn(*shape, self.out_dim, device=x.device, dtype=x.dtype)
            y, flag = x.new_zeros(*shape, self.dim_y), x.new_ones(*shape, 1)
        else:
            flag = x.new_zeros(*shape, 1)
        return self.net(torch.cat([y.to(x.dtype), flag], dim=-1))


@register("encoder", "additive")
class AdditiveEncoder(nn.Module):
    """``phi(embed(x)) + nu(y)`` for context points, ``phi(embed(x))`` for targets: ``[B, N, Dx]`` -> ``[B, N, D]``.

    ``phi`` (shared by context and targets) and ``nu`` are MLPs with ``layers`` linear layers.

    Args:
        dim_x: input dimension Dx.
        dim_y: output dimension Dy of the source it embeds.
        dim: token width D (the output width of ``phi`` and ``nu``).
        hidden: hidden width of ``phi`` and ``nu``; null for ``dim``.
        layers: number of linear layers of ``phi`` and of ``nu`` (``layers - 1`` hidden layers each).
        embed: embedding of ``x`` before ``phi``, a name or ``{name: ..., ...}`` spec (see ``gridtnp list embedding``).
    """

    def __init__(
        self,
        dim_x: int,
        dim_y: int,
        dim: int = 128,
        hidden: int | None = None,
        layers: int = 2,
        embed: dict[str, Any] | str = "identity",
    ) -> None:
        super().__init__()
        self.dim_y, self.out_dim = dim_y, dim
        self.embed = build_from_spec("embedding", embed, dim_x=dim_x)
        self.position = mlp(self.embed.out_dim, dim, hidden or dim, layers)
        self.value = mlp(dim_y, dim, hidden or dim, layers)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        z = self.position(self.embed(x))
        return z if y is None else z + self.value(y.to(z.dtype))
