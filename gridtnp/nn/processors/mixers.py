"""MLP token mixers: ``hypermixer`` (HyperMixer, Mai et al. 2023), for sets and grids.

Interface: ``processor(Latent) -> list[Latent]``, one state per layer (``num_states``), each of the input's layout (a
set ``[B, N, D]`` with its mask, or grid tokens ``[B, M1..Md, D]`` mixed as the flattened set of ``M`` tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gridtnp.nn.mlp import mlp
from gridtnp.nn.processors.checks import check_layers
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


class HyperMixing(nn.Module):
    """HyperMixing token mixing: ``out = W2 GELU(W1^T z / N)`` with ``W1 = h1(z)``, ``W2 = h2(z)`` of the tokens.

    ``z [B, N, D]`` -> ``[B, N, D]``. The hypernetworks ``h1, h2`` (MLPs ``D -> hidden -> P``, one shared when
    ``tied``) turn each token into one row of the token-mixing MLP's weights ``W1, W2 [B, N, P]``, so the mixing
    MLP ``z -> W2 sigma(W1^T z)`` (Mai et al. 2023, eq. 2-3) fits any number of tokens, is equivariant to their
    order and costs O(N P D). Padded tokens (``mask`` False) neither contribute to ``W1^T z`` nor receive output.
    One deviation from the paper: ``W1^T z`` is divided by the number of valid tokens (a mean, not a sum), so the
    hidden units keep their scale across sets of 10 or 10,000 tokens.
    """

    def __init__(self, dim: int, mixing_dim: int, hidden: int, tied: bool) -> None:
        super().__init__()
        self.h1 = mlp(dim, mixing_dim, hidden, 2)
        self.h2 = self.h1 if tied else mlp(dim, mixing_dim, hidden, 2)
        self.act = nn.GELU()

    def forward(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        w1, w2 = self.h1(z), self.h2(z)  # [B, N, P]
        if mask is None:
            count = z.new_full((z.shape[0], 1, 1), z.shape[1])
        else:
            keep = mask.unsqueeze(-1).to(z.dtype)
            w1, w2 = w1 * keep, w2 * keep
            count = keep.sum(1, keepdim=True).clamp(min=1.0)
        hidden = self.act(w1.transpose(1, 2) @ z / count)  # [B, P, D]: the mixing MLP's hidden units, per feature
        return w2 @ hidden  # [B, N, D]


class HyperMixerBlock(nn.Module):
    """Pre-norm HyperMixer layer: ``z += HyperMixing(LN(z)); z += MLP(LN(z))`` on ``[B, N, D]`` with ``mask``."""

    def __init__(self, dim: int, mixing_dim: int, hidden: int, mlp_dim: int, tied: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mixing = HyperMixing(dim, mixing_dim, hidden, tied)
        self.mlp = mlp(dim, dim, mlp_dim, 2)

    def forward(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        z = z + self.mixing(self.norm1(z), mask)
        return z + self.mlp(self.norm2(z))


@register("processor", "hypermixer")
class HyperMixerProcessor(nn.Module):
    """HyperMixer (Mai et al. 2023): token-mixing MLPs generated from the tokens by hypernetworks, ``layers`` blocks.

    A drop-in for ``transformer`` / ``swin`` / ``vit``: on a set ``[B, N, D]`` (with its mask) or on grid tokens
    ``[B, M1..Md, D]`` (flattened, every grid token mixes with every other). Each block is pre-norm HyperMixing
    (``W2 GELU(W1^T z / N)``, ``W1, W2`` from per-token hypernetwork MLPs: see ``HyperMixing``) plus a per-token
    MLP, both residual. Linear in the number of tokens (no N x N attention matrix) and equivariant to their order:
    positions reach it only through the tokens (e.g. the grid encoder's per-location pseudo-tokens). One state per
    layer, so k-NN or cross-attention decoders refresh the targets after each.

    Args:
        dim: token width D.
        layers: number of HyperMixer blocks (one state each); >= 1.
        mixing_dim: hidden units P of the generated token-mixing MLP (rows of W1, W2 per token).
        hyper_hidden: hidden width of the hypernetwork MLPs.
        mlp_dim: hidden width of each block's per-token MLP.
        tied: one hypernetwork for W1 and W2 (the paper's tied variant); false: two.
    """

    def __init__(
        self,
        dim: int = 128,
        layers: int = 5,
        mixing_dim: int = 128,
        hyper_hidden: int = 128,
        mlp_dim: int = 128,
        tied: bool = False,
    ) -> None:
        super().__init__()
        check_layers("hypermixer", layers)
        if mixing_dim < 1 or hyper_hidden < 1:
            raise ValueError(
                f"processor 'hypermixer': mixing_dim and hyper_hidden must be >= 1; got {mixing_dim}, {hyper_hidden}."
            )
        self.blocks = nn.ModuleList(
            HyperMixerBlock(dim, mixing_dim, hyper_hidden, mlp_dim, tied) for _ in range(layers)
        )
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        """``Latent`` -> one ``Latent`` of the same layout per block."""
        z, mask = latent.flat()
        states = []
        for block in self.blocks:  # loop over layers
            z = block(z, mask)
            out = z if mask is None else torch.where(mask.unsqueeze(-1), z, 0.0)
            states.append(latent.with_tokens(out.reshape(latent.tokens.shape)))
        return states
