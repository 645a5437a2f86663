"""Grid decoders that read sets of pseudo-tokens (or any state as a flat set).

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, D]``. A decoder with
``layers = L`` reads the last ``L`` processor states, one block per state, so targets are refreshed after every
processor layer as in the TNP (eq. 9); ``layers = 1`` reads the final state.

* ``cross_attention`` (TNP, PT-TNP; the gridded TNP's "full" decoder on grids), ``concat`` (CNP);
* ``te_cross_attention`` (TE-TNP) and ``relational`` (RCNP) read the states' locations ``Latent.x``;
* ``joint_self_attention`` (MSA) and ``transformer_decoder`` (TFS) let targets attend to each other, so a target's
  prediction depends on the other targets of the call (still permutation equivariant over targets); they say so
  with ``targets_interact = True``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, SelfAttentionBlock
from gridtnp.nn.chunking import DEFAULT_MAX_PAIRS, map_query_chunks
from gridtnp.nn.mlp import mlp
from gridtnp.nn.te_attention import te_attention
from gridtnp.nn.tokens import Latent, last_states
from gridtnp.registry import register


def relative_offsets(xq: Tensor, xk: Tensor, rotation: bool) -> Tensor:
    """Offsets ``x_q - x_k [B, Nq, Nk, Dx]``, or with ``rotation`` their lengths ``[B, Nq, Nk, 1]``."""
    diff = xq.unsqueeze(2) - xk.unsqueeze(1)
    if not rotation:
        return diff
    # sqrt has an infinite derivative at 0 (a point and itself): keep the gradient finite.
    return diff.square().sum(-1, keepdim=True).clamp_min(1e-12).sqrt()


@register("grid_decoder", "cross_attention")
class CrossAttentionDecoder(nn.Module):
    """MHCA from each target token to every pseudo-token (masked set or flattened grid), one block per state.

    On grid latents this is the gridded TNP paper's "full" decoder (Ashman et al.): every target attends to all
    ``M`` grid tokens, ``O(N_t M)``; ``knn`` is the local alternative.

    Args:
        dim: token width D.
        layers: blocks, one per processor state read (the model passes the processor's number of states).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
    """

    def __init__(self, dim: int = 128, layers: int = 1, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "cross_attention"), strict=True):
            z, mask = state.flat()
            zt = block(zt, z, mask)
        return zt


@register("grid_decoder", "concat")
class ConcatDecoder(nn.Module):
    """CNP decoder: MLP on ``cat[zt, r]`` with ``r`` the single aggregated token ``[B, 1, D]``.

    Args:
        dim: token width D.
        hidden: hidden width of the MLP; null for ``dim``.
        layers: number of linear layers of the MLP (the model passes the processor's number of states unless set).
    """

    def __init__(self, dim: int = 128, hidden: int | None = None, layers: int = 3) -> None:
        super().__init__()
        self.net = mlp(2 * dim, dim, hidden or dim, layers)

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        r, _ = states[-1].flat()
        if r.shape[1] != 1:
            raise ValueError(
                f"grid decoder 'concat' needs one aggregated token [B, 1, D]; got {tuple(r.shape)}. "
                "Use processor 'mean'."
            )
        return self.net(torch.cat([zt, r.expand(-1, zt.shape[1], -1)], dim=-1))


@register("grid_decoder", "te_cross_attention")
class TECrossAttentionDecoder(nn.Module):
    """TE-MHCA from the targets ``(zt [B, Nt, D], xt)`` into each state's set ``(tokens, x, mask)``, a block per state.

    Target locations are updated too when ``update_locations`` (eq. 10). TE options as in ``te_transformer``.

    Args:
        dim: token width D.
        dim_x: input dimension Dx.
        layers: blocks, one per processor state read (the model passes the processor's number of states).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        variant: ``post`` (rho of dot products and offsets, eq. 8) or ``pre`` (dot products plus rho of offsets).
        rotation: rho sees ``||x_t - x_n||`` only, so attention is rotation invariant too.
        rho_hidden: hidden width of rho (and of phi).
        update_locations: move the target locations after each block (eq. 10).
        max_pairs: (batch, query, key) triples evaluated at once (memory bound); null for no chunking.
    """

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        layers: int = 1,
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

        def attention(update: bool) -> nn.Module:
            options = (variant, rotation, rho_hidden, update, max_pairs)
            return te_attention(dim, dim_x, heads, head_dim, *options)()

        # The last block's moved locations would never be read: it moves none (no parameter without a gradient).
        self.blocks = nn.ModuleList(
            CrossAttentionBlock(dim, mlp_dim=mlp_dim, attention=attention(update_locations and i < layers - 1))
            for i in range(layers)
        )

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "te_cross_attention"), strict=True):
            z, mask = state.flat()
            zt, xt = block(zt, z, mask, xt, state.locations("grid decoder 'te_cross_attention'"))
        return zt


@register("grid_decoder", "relational")
class RelationalDecoder(nn.Module):
    """Simple RCNP (Huang et al., 2023): ``MLP(mean_n MLP(cat[x_t - x_n, z_n]))`` over the valid context points.

    Reads the final state's set ``(tokens [B, N, D], x, mask)``, ignores ``zt``, returns ``[B, Nt, D]``.

    Translation equivariant (``rotation=True``: the MLP sees ``||x_t - x_n||``, rotation equivariant too). The
    ``[B, Nt, N, hidden]`` pair activations are built ``max_pairs`` (target, context) pairs at a time.

    Args:
        dim: token width D (of the context tokens, both MLPs' outputs and the result).
        dim_x: input dimension Dx.
        hidden: hidden width of both MLPs; null for ``dim``.
        encoder_layers: number of linear layers of the inner MLP on ``cat[x_t - x_n, z_n]``.
        decoder_layers: number of linear layers of the outer MLP on the mean.
        rotation: the inner MLP sees ``||x_t - x_n||`` only, so the decoder is rotation equivariant too.
        max_pairs: (batch, target, context) triples evaluated at once (memory bound); null for no chunking.
    """

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        hidden: int | None = None,
        encoder_layers: int = 3,
        decoder_layers: int = 2,
        rotation: bool = False,
        max_pairs: int | None = DEFAULT_MAX_PAIRS,
    ) -> None:
        super().__init__()
        self.rotation, self.max_pairs = rotation, max_pairs
        self.pair = mlp((1 if rotation else dim_x) + dim, dim, hidden or dim, encoder_layers)
        self.readout = mlp(dim, dim, hidden or dim, decoder_layers)

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        z, mask = states[-1].flat()
        xc = states[-1].locations("grid decoder 'relational'")
        nc = z.shape[1]

        def chunk(start: int, end: int) -> Tensor:
            rel = relative_offsets(xt[:, start:end], xc, self.rotation)  # [B, n, N, R]
            pair = torch.cat([rel.to(z.dtype), z.unsqueeze(1).expand(-1, end - start, -1, -1)], dim=-1)
            h = self.pair(pair)  # [B, n, N, D]
            if mask is None:
                return h.mean(2)
            w = mask[:, None, :, None].to(h.dtype)
            return (h * w).sum(2) / w.sum(2).clamp_min(1.0)  # zeros for an empty context

        pieces = map_query_chunks(chunk, xt.shape[1], xt.shape[0] * nc, self.max_pairs, cpu=z.device.type == "cpu")
        r = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        return self.readout(r)


@register("grid_decoder", "joint_self_attention")
class JointSelfAttentionDecoder(nn.Module):
    """MSA: ``blocks`` MHSA + MLP blocks over the context and target tokens together; returns the targets' part.

    ``cat[context [B, N, D], targets [B, Nt, D]]`` with padded context points masked as keys -> ``[B, Nt, D]``.
    Reads the final state (use processor ``identity``).

    Args:
        dim: token width D.
        blocks: number of MHSA + MLP blocks over the context and targets together; >= 1.
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
        context_keys_only: every token attends to the context tokens only (the TNP's mask, Nguyen & Grover 2022:
            targets do not see one another, so each prediction depends on its own target alone); false: MSA.
    """

    def __init__(
        self,
        dim: int = 128,
        blocks: int = 5,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        context_keys_only: bool = False,
    ) -> None:
        super().__init__()
        if blocks < 1:
            raise ValueError(f"grid decoder 'joint_self_attention': blocks must be >= 1; got {blocks}.")
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(blocks))
        self.context_keys_only = context_keys_only
        self.targets_interact = not context_keys_only

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        zc, mask_c = states[-1].as_set()
        nc = zc.shape[1]
        z = torch.cat([zc, zt.to(zc.dtype)], dim=1)
        mask = torch.cat([mask_c, mask_c.new_full(zt.shape[:2], not self.context_keys_only)], dim=1)
        for block in self.blocks:
            z = block(z, mask)
        return z[:, nc:]


@register("grid_decoder", "transformer_decoder")
class TransformerDecoder(nn.Module):
    """TFS decoder: ``layers`` x (MHSA among the targets, then MHCA + MLP from the targets to the final state).

    Args:
        dim: token width D.
        layers: number of layers, all reading the final state (the model passes the processor's number of states).
        heads: attention heads.
        head_dim: width of each head.
        mlp_dim: hidden width of each block's MLP.
    """

    targets_interact = True

    def __init__(self, dim: int = 128, layers: int = 1, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"grid decoder 'transformer_decoder': layers must be >= 1; got {layers}.")
        self.self_attn = nn.ModuleList(SelfAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))
        self.cross = nn.ModuleList(CrossAttentionBlock(dim, heads, head_dim, mlp_dim) for _ in range(layers))

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        memory, mask = states[-1].as_set()
        for self_attn, cross in zip(self.self_attn, self.cross, strict=True):
            zt = cross(self_attn(zt), memory, mask)
        return zt
