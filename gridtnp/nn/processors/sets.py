"""Set processors: pseudo-tokens that are a set ``[B, N, D]`` (with mask, and locations for TE models).

Interface: ``processor(Latent) -> list[Latent]``, ``num_states`` entries. Grid-free baselines use these:
``transformer`` (TNP; also runs on a flattened grid), ``mean`` (CNP), ``identity`` (RCNP, MSA), the pseudo-token
TNPs ``ist`` and ``perceiver`` (states: ``M`` pseudo-tokens ``[B, M, D]``), and the translation-equivariant
``te_transformer`` and ``te_perceiver``, whose states carry locations ``Latent.x`` (updated by eq. 10 when
``update_locations``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, SelfAttentionBlock, masked_mean, standardise
from gridtnp.nn.chunking import DEFAULT_MAX_PAIRS
from gridtnp.nn.processors.checks import check_layers
from gridtnp.nn.te_attention import te_attention
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


@register("processor", "transformer")
class TransformerProcessor(nn.Module):
    """Full MHSA over all pseudo-tokens (a set ``[B, N, D]`` with mask, or a flattened grid), ``layers`` blocks.

    Args:
        dim: token width D.
        layers: number of MHSA + MLP blocks (one state each).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
    """

    def __init__(self, dim: int = 128, layers: int = 5, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        check_layers("transformer", layers)
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        """``Latent`` -> one ``Latent`` of the same layout per block."""
        z, mask = latent.flat()
        states = []
        for block in self.blocks:
            z = block(z, mask)
            states.append(latent.with_tokens(z.reshape(latent.tokens.shape)))
        return states


@register("processor", "mean")
class MeanProcessor(nn.Module):
    """Deep-set aggregation (CNP): masked mean of the tokens -> one token ``[B, 1, D]``; zeros if empty."""

    num_states = 1

    def forward(self, latent: Latent) -> list[Latent]:
        """``Latent [B, N, D]`` -> ``[Latent([B, 1, D])]``."""
        z, mask = latent.flat()
        return [Latent(masked_mean(z, mask).unsqueeze(1))]


@register("processor", "identity")
class IdentityProcessor(nn.Module):
    """No processing: the grid encoder's latent is the single state (RCNP, MSA: the decoder does the work)."""

    num_states = 1

    def forward(self, latent: Latent) -> list[Latent]:
        """``Latent`` -> ``[Latent]``."""
        return [latent]


class _PseudoTokenProcessor(nn.Module):
    """``M`` learned initial pseudo-tokens ``[M, D]`` and, per layer, a block ``to_pseudo`` (MHCA from the
    pseudo-tokens to the context) and a block ``mix`` (what the variant does next)."""

    def __init__(
        self,
        name: str,
        dim: int,
        num_tokens: int,
        layers: int,
        to_pseudo: Callable[[], nn.Module],
        mix: Callable[[], nn.Module],
        mix_layers: int | None = None,
    ) -> None:
        super().__init__()
        if num_tokens < 1:
            raise ValueError(f"processor {name!r}: num_tokens must be >= 1; got {num_tokens}.")
        check_layers(name, layers)
        self.pseudo_tokens = nn.Parameter(torch.randn(num_tokens, dim) * dim**-0.5)
        self.to_pseudo = nn.ModuleList(to_pseudo() for _ in range(layers))
        self.mix = nn.ModuleList(mix() for _ in range(layers if mix_layers is None else mix_layers))
        self.num_states = layers

    def initial(self, batch_size: int, dtype: torch.dtype) -> Tensor:
        """The initial pseudo-tokens ``[B, M, D]``."""
        return self.pseudo_tokens.to(dtype).expand(batch_size, -1, -1)


@register("processor", "ist")
class InducedSetProcessor(_PseudoTokenProcessor):
    """PT-TNP, induced-set-transformer style: per layer U <- MHCA(U; Zc), Zc <- MHCA(Zc; U); states are U.

    The last layer has no context update: nothing reads ``Zc`` after it (the decoder reads the states U), so it
    would only cost an ``N_c``-query attention per forward pass (and leave unused parameters under DDP).

    Args:
        dim: token width D.
        num_tokens: number of pseudo-tokens M.
        layers: number of layers (one state each).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
    """

    def __init__(
        self,
        dim: int = 128,
        num_tokens: int = 128,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
    ) -> None:
        block = partial(CrossAttentionBlock, dim, heads, head_dim, mlp_dim)
        super().__init__("ist", dim, num_tokens, layers, block, block, mix_layers=layers - 1)

    def forward(self, latent: Latent) -> list[Latent]:
        """Context set ``[B, N, D]`` -> one ``Latent([B, M, D])`` per layer."""
        zc, mask = latent.flat()
        u = self.initial(zc.shape[0], zc.dtype)
        states = []
        for i, to_pseudo in enumerate(self.to_pseudo):
            u = to_pseudo(u, zc, mask)
            if i < len(self.mix):
                zc = self.mix[i](zc, u)
            states.append(Latent(u))
        return states


@register("processor", "perceiver")
class PerceiverProcessor(_PseudoTokenProcessor):
    """PT-TNP, perceiver / LBANP style: per layer U <- MHCA(U; Zc) then U <- MHSA(U); states are U.

    Args:
        dim: token width D.
        num_tokens: number of pseudo-tokens M.
        layers: number of layers (one state each).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
    """

    def __init__(
        self,
        dim: int = 128,
        num_tokens: int = 128,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
    ) -> None:
        cross = partial(CrossAttentionBlock, dim, heads, head_dim, mlp_dim)
        super().__init__(
            "perceiver", dim, num_tokens, layers, cross, partial(SelfAttentionBlock, dim, heads, head_dim, mlp_dim)
        )

    def forward(self, latent: Latent) -> list[Latent]:
        """Context set ``[B, N, D]`` -> one ``Latent([B, M, D])`` per layer."""
        zc, mask = latent.flat()
        # Every layer normalises the same context: standardise it once and let each block fold its norm_kv affine
        # into its key and value weights (one LayerNorm over [B, N_c, D] instead of one per layer). The blocks are
        # built alike, so every norm_kv has the same shape and eps.
        nc = standardise(zc, self.to_pseudo[0].norm_kv)
        u = self.initial(zc.shape[0], zc.dtype)
        states = []
        for cross, self_attn in zip(self.to_pseudo, self.mix, strict=True):
            u = self_attn(cross.forward_standardised(u, nc, mask))
            states.append(Latent(u))
        return states


@register("processor", "te_transformer")
class TETransformerProcessor(nn.Module):
    """TE-TNP context layers: ``layers`` TE-MHSA blocks over the context set ``[B, N, D]`` at ``x [B, N, Dx]``.

    States carry the (updated) locations. Needs grid encoder ``identity`` (which keeps the locations).

    Args:
        dim: token width D.
        dim_x: input dimension Dx.
        layers: number of TE-MHSA + MLP blocks (one state each).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        variant: ``post`` (rho of dot products and offsets, eq. 8) or ``pre`` (dot products plus rho of offsets).
        rotation: rho sees ``||x_n - x_m||`` only, so attention is rotation invariant too.
        rho_hidden: hidden width of rho (and of phi).
        update_locations: move the locations after each block (eq. 10).
        max_pairs: (batch, query, key) triples evaluated at once (memory bound); null for no chunking.
    """

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
        update_locations: bool = False,
        max_pairs: int | None = DEFAULT_MAX_PAIRS,
    ) -> None:
        super().__init__()
        check_layers("te_transformer", layers)
        attention = te_attention(
            dim, dim_x, heads, head_dim, variant, rotation, rho_hidden, update_locations, max_pairs
        )
        self.blocks = nn.ModuleList(
            SelfAttentionBlock(dim, mlp_dim=mlp_dim, attention=attention()) for _ in range(layers)
        )
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        """Context set ``[B, N, D]`` at ``x [B, N, Dx]`` -> one located ``Latent`` per block."""
        z, mask = latent.flat()
        x = latent.locations("processor 'te_transformer'")
        states = []
        for block in self.blocks:
            z, x = block(z, mask, x)
            states.append(Latent(z, mask=mask, x=x))
        return states


@register("processor", "te_perceiver")
class TEPerceiverProcessor(_PseudoTokenProcessor):
    """TE-PT-TNP: ``M`` pseudo-tokens with pseudo-locations; per layer TE-MHCA(U; context) then TE-MHSA(U).

    Pseudo-locations start as a learned offset plus an attention-weighted average of the context locations
    (eq. 11): ``x_u_m = v0_m + sum_n softmax_n(q(u_m) . k(z_n) / sqrt(Dh)) x_n``, ``v0 [M, Dx]`` initialised to
    zeros. The weights depend on tokens only, so the pseudo-locations move with the context, and the offsets let
    them leave the context's convex hull. With an empty context the pseudo-tokens are masked out of the states
    (targets then get a zero attention update, a prior-like prediction). States: ``Latent([B, M, D], x=[B, M, Dx])``.

    Args:
        dim: token width D.
        dim_x: input dimension Dx.
        num_tokens: number of pseudo-tokens M.
        layers: number of layers (one state each).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        variant: ``post`` or ``pre``, as in ``te_transformer``.
        rotation: rho sees ``||x_n - x_m||`` only.
        rho_hidden: hidden width of rho (and of phi).
        update_locations: move the locations after each block (eq. 10).
        max_pairs: (batch, query, key) triples evaluated at once (memory bound); null for no chunking.
    """

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        num_tokens: int = 128,
        layers: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
        update_locations: bool = False,
        max_pairs: int | None = DEFAULT_MAX_PAIRS,
    ) -> None:
        attention = te_attention(
            dim, dim_x, heads, head_dim, variant, rotation, rho_hidden, update_locations, max_pairs
        )
        super().__init__(
            "te_perceiver",
            dim,
            num_tokens,
            layers,
            lambda: CrossAttentionBlock(dim, mlp_dim=mlp_dim, attention=attention()),
            lambda: SelfAttentionBlock(dim, mlp_dim=mlp_dim, attention=attention()),
        )
        self.location_query = nn.Linear(dim, head_dim, bias=False)
        self.location_key = nn.Linear(dim, head_dim, bias=False)
        self.location_offset = nn.Parameter(torch.zeros(num_tokens, dim_x))  # v0_m of eq. 11

    def initial_locations(self, u: Tensor, zc: Tensor, xc: Tensor, mask: Tensor | None) -> Tensor:
        """Eq. 11: ``[B, M, Dx]`` offsets ``v0`` plus attention-weighted averages of ``xc [B, N, Dx]``.

        An empty context gives ``v0`` (those pseudo-tokens are masked out of the states anyway).
        """
        logits = (self.location_query(u) @ self.location_key(zc).transpose(-1, -2)).float()
        logits = logits * self.location_query.out_features**-0.5  # [B, M, N]
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
            logits = torch.where(mask.any(-1)[:, None, None], logits, 0.0)  # an empty row: finite, then unused
        return self.location_offset.float() + logits.softmax(-1) @ xc.float()

    def forward(self, latent: Latent) -> list[Latent]:
        """Context set ``[B, N, D]`` at ``x [B, N, Dx]`` -> one ``Latent([B, M, D], x=[B, M, Dx])`` per layer."""
        zc, mask = latent.flat()
        xc = latent.locations("processor 'te_perceiver'")
        u = self.initial(zc.shape[0], zc.dtype)
        xu = self.initial_locations(u, zc, xc, mask).to(xc.dtype)
        # Pseudo-tokens of a task without context carry no information and no meaningful location: masked out.
        u_mask = None if mask is None else mask.any(-1, keepdim=True).expand(-1, u.shape[1])
        states = []
        for cross, self_attn in zip(self.to_pseudo, self.mix, strict=True):
            u, xu = cross(u, zc, mask, xu, xc)
            u, xu = self_attn(u, u_mask, xu)
            states.append(Latent(u, mask=u_mask, x=xu))
        return states
