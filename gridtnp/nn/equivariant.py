"""Translation-equivariant components: TE-TNP, TE-PT-TNP, RCNP and the TE k-NN grid decoder.

A model is translation equivariant when its predictions do not change as every context and target location moves by
the same vector. These components see locations only through differences ``x_n - x_m`` (TE attention, see
``gridtnp.nn.te_attention``; the RCNP's relational encoder), and the ``value`` encoder builds tokens from the values
alone, so the five-slot pipeline ``value -> identity -> te_transformer -> te_cross_attention -> gaussian`` is
translation equivariant end to end (TE-TNP, Ashman et al. 2024). Locations travel in ``Latent.x`` and may be
updated by the blocks (eq. 10).

``te_knn`` is the gridded TNP's k-NN decoder with TE attention on the target-to-grid-point offset; in a Swin-TNP the
grid tokens themselves still come from an encoder that sees ``x``, so only the decoding step is equivariant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from gridtnp.nn.attention import CrossAttentionBlock, mlp
from gridtnp.nn.grid_decoders import KNNDecoder, _gather_heads, _state_grid, last_states
from gridtnp.nn.grids import Grid
from gridtnp.nn.te_attention import (
    DEFAULT_MAX_PAIRS,
    TEAttention,
    TECrossAttentionBlock,
    TESelfAttentionBlock,
    map_query_chunks,
    relative_features,
)
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register

TARGET_INITS = ("learned", "random")


@register("encoder", "value")
class ValueEncoder(nn.Module):
    """Tokens from values only (TE-TNP): context ``MLP(cat[y, 0])``, targets ``MLP(cat[0, 1])``; ``x`` is ignored.

    ``x [B, N, Dx]``, ``y [B, N, Dy] | None`` -> ``[B, N, D]``. Every target starts from the same learned token
    (``target_init="learned"``) or from fresh standard-normal noise at each call (``"random"``, which makes
    predictions random too); TE blocks then tell targets apart by their locations relative to the context.
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


def _te_options(
    variant: str, rotation: bool, rho_hidden: int, update_locations: bool, max_pairs: int | None
) -> dict[str, Any]:
    return {
        "variant": variant,
        "rotation": rotation,
        "rho_hidden": rho_hidden,
        "update_locations": update_locations,
        "max_pairs": max_pairs,
    }


def _locations(latent: Latent, name: str) -> Tensor:
    if latent.x is None:
        raise ValueError(
            f"{name} needs the tokens' locations (Latent.x); use grid encoder 'identity', which keeps them, and a "
            "TE processor."
        )
    return latent.x


@register("processor", "te_transformer")
class TETransformerProcessor(nn.Module):
    """TE-TNP context layers: ``layers`` TE-MHSA blocks over the context set ``[B, N, D]`` at ``x [B, N, Dx]``.

    ``variant`` ``post`` | ``pre``, ``rotation`` (rho sees ``||x_n - x_m||``), ``update_locations`` (eq. 10) and
    ``max_pairs`` (memory bound) are those of ``TEAttention``. States carry the (updated) locations.
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
        if layers < 1:
            raise ValueError(f"processor 'te_transformer': layers must be >= 1; got {layers}.")
        te = _te_options(variant, rotation, rho_hidden, update_locations, max_pairs)
        self.blocks = nn.ModuleList(
            TESelfAttentionBlock(dim, dim_x, heads, head_dim, mlp_dim, **te) for _ in range(layers)
        )
        self.num_states = layers

    def forward(self, latent: Latent) -> list[Latent]:
        z, mask = latent.flat()
        x = _locations(latent, "processor 'te_transformer'")
        states = []
        for block in self.blocks:
            z, x = block(z, x, mask)
            states.append(Latent(z, mask=mask, x=x))
        return states


@register("processor", "te_perceiver")
class TEPerceiverProcessor(nn.Module):
    """TE-PT-TNP: ``M`` pseudo-tokens with pseudo-locations; per layer TE-MHCA(U; context) then TE-MHSA(U).

    Pseudo-locations start as attention-weighted averages of the context locations (eq. 11):
    ``x_u_m = sum_n softmax_n(q(u_m) . k(z_n) / sqrt(Dh)) x_n``. The weights depend on tokens only, so the
    pseudo-locations move with the context. With an empty context the pseudo-tokens are masked out of the states
    (targets then get a zero attention update, a prior-like prediction). States: ``Latent([B, M, D], x=[B, M, Dx])``.
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
        super().__init__()
        if layers < 1 or num_tokens < 1:
            raise ValueError(
                f"processor 'te_perceiver': layers and num_tokens must be >= 1; got {layers}, {num_tokens}."
            )
        te = _te_options(variant, rotation, rho_hidden, update_locations, max_pairs)
        self.pseudo_tokens = nn.Parameter(torch.randn(num_tokens, dim) * dim**-0.5)
        self.location_query = nn.Linear(dim, head_dim, bias=False)
        self.location_key = nn.Linear(dim, head_dim, bias=False)
        self.cross = nn.ModuleList(
            TECrossAttentionBlock(dim, dim_x, heads, head_dim, mlp_dim, **te) for _ in range(layers)
        )
        self.self_attn = nn.ModuleList(
            TESelfAttentionBlock(dim, dim_x, heads, head_dim, mlp_dim, **te) for _ in range(layers)
        )
        self.num_states = layers

    def initial_locations(self, u: Tensor, zc: Tensor, xc: Tensor, mask: Tensor | None) -> Tensor:
        """Eq. 11: ``[B, M, Dx]`` attention-weighted averages of ``xc [B, N, Dx]`` (zeros for an empty context)."""
        logits = (self.location_query(u) @ self.location_key(zc).transpose(-1, -2)).float()
        logits = logits * self.location_query.out_features**-0.5  # [B, M, N]
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
            logits = torch.where(mask.any(-1)[:, None, None], logits, 0.0)  # an empty row: finite, then unused
        return logits.softmax(-1) @ xc.float()

    def forward(self, latent: Latent) -> list[Latent]:
        zc, mask = latent.flat()
        xc = _locations(latent, "processor 'te_perceiver'")
        u = self.pseudo_tokens.to(zc.dtype).expand(zc.shape[0], -1, -1)
        xu = self.initial_locations(u, zc, xc, mask).to(xc.dtype)
        # Pseudo-tokens of a task without context carry no information and no meaningful location: masked out.
        u_mask = None if mask is None else mask.any(-1, keepdim=True).expand(-1, u.shape[1])
        states = []
        for cross, self_attn in zip(self.cross, self.self_attn, strict=True):
            u, xu = cross(u, xu, zc, xc, mask)
            u, xu = self_attn(u, xu, u_mask)
            states.append(Latent(u, mask=u_mask, x=xu))
        return states


@register("grid_decoder", "te_cross_attention")
class TECrossAttentionDecoder(nn.Module):
    """TE-MHCA from the targets ``(zt [B, Nt, D], xt)`` into each state's set ``(tokens, x, mask)``, a block per state.

    Target locations are updated too when ``update_locations`` (eq. 10). TE options as in ``te_transformer``.
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
        te = _te_options(variant, rotation, rho_hidden, update_locations, max_pairs)
        self.blocks = nn.ModuleList(
            TECrossAttentionBlock(dim, dim_x, heads, head_dim, mlp_dim, **te) for _ in range(layers)
        )

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "te_cross_attention"), strict=True):
            z, mask = state.flat()
            zt, xt = block(zt, xt, z, _locations(state, "grid decoder 'te_cross_attention'"), mask)
        return zt


class TENeighbourCrossAttentionBlock(CrossAttentionBlock):
    """Pre-norm TE-MHCA + MLP where each target attends to its ``K`` gathered grid tokens, the logits depending on
    the target-to-grid-point offsets through ``rho`` (``TEAttention.logits``)."""

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 2,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
    ) -> None:
        super().__init__(dim, heads, head_dim, mlp_dim)
        self.attn = TEAttention(dim, dim_x, heads, head_dim, variant, rotation, rho_hidden)  # type: ignore[assignment]

    def forward(  # type: ignore[override]
        self, zq: Tensor, zkv: Tensor, index: Tensor, valid: Tensor, offset: Tensor
    ) -> Tensor:
        """``zq [B, Nt, D]`` attends to ``zkv [B, M, D]`` at ``index, valid [B, Nt, K]``, offsets ``[B, Nt, K, d]``."""
        b, nt, k = index.shape
        attn = self.attn
        kv = attn.to_kv(self.norm_kv(zkv)).chunk(2, dim=-1)
        keys, values = (_gather_heads(attn.split_heads(t), index) for t in kv)  # [B*Nt, H, K, Dh]
        q = attn.split_heads(attn.to_q(self.norm_q(zq)).reshape(b * nt, 1, -1))  # [B*Nt, H, 1, Dh]
        rel = offset.reshape(b * nt, 1, k, -1)
        if attn.rotation:
            rel = rel.square().sum(-1, keepdim=True).clamp_min(1e-12).sqrt()
        logits = attn.logits(q, keys, rel).float()  # [B*Nt, H, 1, K]
        valid = valid.reshape(b * nt, 1, 1, k)
        has_key = valid.any(-1, keepdim=True)
        weights = logits.masked_fill(~(valid | ~has_key), float("-inf")).softmax(-1).to(values.dtype)
        out = attn.out((weights @ values).reshape(b, nt, -1)) * has_key.reshape(b, nt, 1).to(zq.dtype)
        zq = zq + out
        return zq + self.mlp(self.norm2(zq))


@register("grid_decoder", "te_knn")
class TEKNNDecoder(KNNDecoder):
    """k-NN grid decoder with TE attention: logits are an MLP of dot products and target-to-grid-point offsets.

    Each target attends to its ``k`` nearest grid tokens; the offsets are ``(x_t - g) / spacing`` (wrapped along
    rolled dimensions), so only where a grid point lies relative to the target matters, not where the target is.

    Same neighbour search as ``knn`` (``O(N_t k)``), one block per processor state; ``variant``, ``rotation``
    (rho sees the offset's length, in grid spacings) and ``rho_hidden`` as in ``TEAttention``.
    """

    def __init__(
        self,
        grid: Grid | None = None,
        dim: int = 128,
        k: int = 9,
        layers: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dim_x: int | None = None,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
    ) -> None:
        super().__init__(grid, dim, k, layers, heads, head_dim, mlp_dim, dim_x=dim_x)
        rel_dim = dim_x if dim_x is not None else (grid.ndim if grid is not None else None)
        if rel_dim is None:
            raise ValueError("grid decoder 'te_knn' needs dim_x or grid to size the offset features.")
        self.blocks = nn.ModuleList(
            TENeighbourCrossAttentionBlock(dim, rel_dim, heads, head_dim, mlp_dim, variant, rotation, rho_hidden)
            for _ in range(layers)
        )

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        """Target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]``."""
        xt = xt.float()
        neighbourhoods: dict[Grid, tuple[Tensor, Tensor, Tensor | None]] = {}
        for block, state in zip(self.blocks, last_states(states, len(self.blocks), "te_knn"), strict=True):
            grid = _state_grid(state, self.grid, "te_knn")
            if grid not in neighbourhoods:
                neighbourhoods[grid] = self._neighbours(grid, xt, True)
            zt = block(zt, state.flat()[0], *neighbourhoods[grid])
        return zt


@register("grid_decoder", "relational")
class RelationalDecoder(nn.Module):
    """Simple RCNP (Huang et al., 2023): ``MLP(mean_n MLP(cat[x_t - x_n, z_n]))`` over the valid context points.

    Reads the final state's set ``(tokens [B, N, D], x, mask)``, ignores ``zt``, returns ``[B, Nt, D]``.

    Translation equivariant (``rotation=True``: the MLP sees ``||x_t - x_n||``, rotation equivariant too). The
    ``[B, Nt, N, hidden]`` pair activations are built ``max_pairs`` (target, context) pairs at a time.
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
        xc = _locations(states[-1], "grid decoder 'relational'")
        nc = z.shape[1]

        def chunk(start: int, end: int) -> Tensor:
            _, rel = relative_features(xt[:, start:end], xc, self.rotation)  # [B, n, N, R]
            pair = torch.cat([rel.to(z.dtype), z.unsqueeze(1).expand(-1, end - start, -1, -1)], dim=-1)
            h = self.pair(pair)  # [B, n, N, D]
            if mask is None:
                return h.mean(2)
            w = mask[:, None, :, None].to(h.dtype)
            return (h * w).sum(2) / w.sum(2).clamp_min(1.0)  # zeros for an empty context

        pieces = map_query_chunks(chunk, xt.shape[1], xt.shape[0] * nc, self.max_pairs, cpu=z.device.type == "cpu")
        r = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        return self.readout(r)


__all__ = [
    "RelationalDecoder",
    "TECrossAttentionDecoder",
    "TEKNNDecoder",
    "TEPerceiverProcessor",
    "TETransformerProcessor",
    "ValueEncoder",
]
