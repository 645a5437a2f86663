"""Attention models for sparse measurements: multi-layer self-attention (MSA) and the TFS encoder-decoder baseline.

MSA: a shared position encoder ``phi(x)`` embeds context and target locations alike; a value encoder ``nu(y)`` is
added to the context positions (``additive`` encoder); full self-attention then runs over the context and target
tokens together (``joint_self_attention`` decoder), and an MLP reads out the targets (the likelihood head).

TFS: the transformer encoder-decoder (Vaswani et al., 2017) on the same tokens: self-attention over the context
(processor ``transformer``), then per decoder layer self-attention among the targets and cross-attention from the
targets to the encoder's final output (``transformer_decoder``).

In both, targets attend to each other, so a target's prediction depends on the other targets in the batch (still
permutation equivariant over targets); the decoders say so with ``targets_interact = True``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, SelfAttentionBlock, mlp
from gridtnp.nn.tokens import Latent
from gridtnp.registry import build_from_spec, register


@register("encoder", "additive")
class AdditiveEncoder(nn.Module):
    """``phi(embed(x)) + nu(y)`` for context points, ``phi(embed(x))`` for targets: ``[B, N, Dx]`` -> ``[B, N, D]``.

    ``phi`` (shared by context and targets) and ``nu`` are MLPs with ``layers`` linear layers.
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


def _set(state: Latent) -> tuple[Tensor, Tensor]:
    """The state as a set ``[B, N, D]`` with a mask ``[B, N]`` (all True when it has none)."""
    z, mask = state.flat()
    if mask is None:
        mask = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
    return z, mask


@register("grid_decoder", "joint_self_attention")
class JointSelfAttentionDecoder(nn.Module):
    """MSA: ``blocks`` MHSA + MLP blocks over the context and target tokens together; returns the targets' part.

    ``cat[context [B, N, D], targets [B, Nt, D]]`` with padded context points masked as keys -> ``[B, Nt, D]``.
    Reads the final state (use processor ``identity``).
    """

    targets_interact = True

    def __init__(self, dim: int = 128, blocks: int = 5, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        if blocks < 1:
            raise ValueError(f"grid decoder 'joint_self_attention': blocks must be >= 1; got {blocks}.")
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(blocks))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        zc, mask_c = _set(states[-1])
        nc = zc.shape[1]
        z = torch.cat([zc, zt.to(zc.dtype)], dim=1)
        mask = torch.cat([mask_c, mask_c.new_ones(zt.shape[:2])], dim=1)
        for block in self.blocks:
            z = block(z, mask)
        return z[:, nc:]


@register("grid_decoder", "transformer_decoder")
class TransformerDecoder(nn.Module):
    """TFS decoder: ``layers`` x (MHSA among the targets, then MHCA + MLP from the targets to the final state)."""

    targets_interact = True

    def __init__(self, dim: int = 128, layers: int = 1, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"grid decoder 'transformer_decoder': layers must be >= 1; got {layers}.")
        self.self_attn = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.cross = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        memory, mask = _set(states[-1])
        for self_attn, cross in zip(self.self_attn, self.cross, strict=True):
            zt = cross(self_attn(zt), memory, mask)
        return zt


__all__ = ["AdditiveEncoder", "JointSelfAttentionDecoder", "TransformerDecoder"]
