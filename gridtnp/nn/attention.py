"""Attention layers shared by every stage: multi-head attention and the pre-norm blocks.

* ``MultiHeadAttention``: queries ``[B, Nq, D]`` attend to keys/values ``[B, Nk, D]`` -> ``[B, Nq, D]``, through
  ``F.scaled_dot_product_attention``.
* ``SelfAttentionBlock`` / ``CrossAttentionBlock``: the pre-norm residual block ``z += Attn(LN(z), LN(kv));
  z += MLP(LN(z))`` with the attention as a parameter (plain by default, or a ``TEAttention`` from
  ``gridtnp.nn.te_attention``; with locations the blocks return ``(z, x)`` with the updated locations).

Defaults follow the TNP papers: ``D_z = 128``, 8 heads of 16 dimensions, feed-forward width 128. Masks are boolean,
``True`` = attend: a key mask ``[B, Nk]`` or a per-query mask ``[B, Nq, Nk]``. A query with no valid key (an empty
context) gets a zero attention output rather than NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gridtnp.nn.mlp import mlp
from gridtnp.nn.tokens import nothing_masked


def standardise(z: Tensor, norm: nn.LayerNorm) -> Tensor:
    """``norm(z)`` without its affine: ``(z - mean) / std`` over ``norm``'s shape (see ``attend_standardised``)."""
    return F.layer_norm(z, norm.normalized_shape, eps=norm.eps)


def masked_mean(z: Tensor, mask: Tensor | None, dim: int = 1) -> Tensor:
    """Mean of ``z [B, N, D]`` over valid points (``mask [B, N]``); zeros for an empty set."""
    if mask is None:
        return z.mean(dim)
    w = mask.to(z.dtype).unsqueeze(-1)
    return (z * w).sum(dim) / w.sum(dim).clamp(min=1.0)


def attention_mask(mask: Tensor | None, num_queries: int) -> tuple[Tensor | None, Tensor | None]:
    """Broadcast a key mask ``[B, Nk]`` or ``[B, Nq, Nk]`` to SDPA's ``[B, 1, Nq|1, Nk]``.

    Returns the mask with empty rows opened up (so softmax is finite) and a ``[B, Nq, 1]``
    indicator of queries that had at least one valid key, or ``(None, None)``.
    """
    if mask is None:
        return None, None
    if nothing_masked(mask):  # no padding: SDPA's unmasked kernel and no output scaling
        return None, None
    if mask.dim() == 2:
        mask = mask[:, None, :]  # [B, 1, Nk]
    has_key = mask.any(-1, keepdim=True)  # [B, Nq|1, 1]
    # Rows with no valid key would give softmax over all -inf = NaN: let them attend to everything,
    # then zero their output, so values and gradients stay finite. No host sync is needed.
    safe = mask | ~has_key
    return safe[:, None], has_key.expand(-1, num_queries, -1)


# On the CPU, SDPA's flash kernel costs about twice an explicit softmax(q k^T / sqrt(Dh)) v for windows of at most
# this many keys (Swin's 4 x 4 windows: 16) with several queries, forward and backward; from 64 keys on it is faster.
FEW_KEYS = 32


def few_keys(q: Tensor, k: Tensor, dropout: float) -> bool:
    """Whether ``explicit_attention`` beats SDPA: CPU, several queries, at most ``FEW_KEYS`` keys, no dropout."""
    return q.device.type == "cpu" and q.shape[-2] > 1 and k.shape[-2] <= FEW_KEYS and dropout == 0.0


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """``softmax(q k^T / sqrt(Dh) + mask) v`` for ``q [..., Nq, Dh]``, ``k, v [..., Nk, Dh]``; ``mask`` as SDPA's
    (boolean, True = attend, or additive float), broadcastable to ``[..., Nq, Nk]``; softmax in float32 or wider."""
    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    weights = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)
    return weights.to(v.dtype) @ v


class MultiHeadAttention(nn.Module):
    """Multi-head attention: queries ``[B, Nq, D]``, keys/values ``[B, Nk, D]`` -> ``[B, Nq, D]``."""

    located = False  # takes no locations (see TEAttention)

    def __init__(self, dim: int = 128, heads: int = 8, head_dim: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.out = nn.Linear(inner, dim)

    def split_heads(self, t: Tensor) -> Tensor:
        """``[B, N, H*Dh]`` -> ``[B, H, N, Dh]``."""
        return t.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def kv_rows(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``[..., H*Dh]`` each, from ``kv [..., D]``: two products with the halves of ``to_kv``
        (no ``[..., 2 H Dh]`` output to split, whose backward would copy both gradients back into one)."""
        w_k, w_v = self.to_kv.weight.chunk(2)
        b_k, b_v = (None, None) if self.to_kv.bias is None else self.to_kv.bias.chunk(2)
        return F.linear(kv, w_k, b_k), F.linear(kv, w_v, b_v)

    def project_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, H, Nk, Dh]`` each (exposed so callers can project once and gather)."""
        k, v = self.kv_rows(kv)
        return self.split_heads(k), self.split_heads(v)

    def forward(self, q: Tensor, kv: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attend from ``q [B, Nq, D]`` to ``kv [B, Nk, D]``; ``mask`` is ``[B, Nk]`` or ``[B, Nq, Nk]``."""
        k, v = self.project_kv(kv)
        return self.attend(q, k, v, mask)

    def attend_standardised(self, q: Tensor, nkv: Tensor, norm: nn.LayerNorm, mask: Tensor | None = None) -> Tensor:
        """``attend(q, *project_kv(norm(kv)), mask)`` from ``nkv = standardise(kv, norm)`` ``[B, Nk, D]``, which
        attentions that read the same ``kv`` can share; ``norm``'s affine ``n * g + b`` is folded into the weights.

        The shift ``b`` moves every key by ``W_k b``, which adds ``q . W_k b`` to all of a query's logits: softmax
        ignores it, so the keys need no bias. It moves every value by ``W_v b`` and, as a query's weights sum to one,
        its output by the same: added once per query instead of once per key (not under dropout, whose weights do
        not sum to one).
        """
        w_k, w_v = self.to_kv.weight.chunk(2)
        b_v = None if self.to_kv.bias is None else self.to_kv.bias.chunk(2)[1]
        if norm.bias is not None:
            b_v = w_v @ norm.bias if b_v is None else w_v @ norm.bias + b_v
        if norm.weight is not None:
            w_k, w_v = w_k * norm.weight, w_v * norm.weight
        k = F.linear(nkv, w_k)
        if self.dropout and self.training:
            v, b_v = F.linear(nkv, w_v, b_v), None
        else:
            v = F.linear(nkv, w_v)
        return self.attend(q, self.split_heads(k), self.split_heads(v), mask, value_shift=b_v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        value_shift: Tensor | None = None,
    ) -> Tensor:
        """Attention from raw queries ``[B, Nq, D]`` to projected ``k, v [B, H, Nk, Dh]``; ``bias`` (broadcastable
        to ``[B, H, Nq, Nk]``) is added to the logits, ``value_shift [H*Dh]`` to the attention output (as if to
        every value; only without dropout)."""
        qh = self.split_heads(self.to_q(q))
        attn_mask, has_key = attention_mask(mask, q.shape[1])
        if bias is not None:
            bias = bias.to(qh.dtype)
            attn_mask = bias if attn_mask is None else torch.where(attn_mask, bias, float("-inf"))
        dropout = self.dropout if self.training else 0.0
        if few_keys(qh, k, dropout):
            out = explicit_attention(qh, k, v, attn_mask)
        else:
            if qh.device.type == "cpu" and (k.requires_grad or v.requires_grad):
                # On the interleaved heads of split_heads the CPU flash kernel's backward pass is slower than on
                # contiguous copies (forward+backward about 8 % at 128 queries and 10,000 keys); a forward pass
                # alone does not repay the copies.
                k, v = k.contiguous(), v.contiguous()
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=attn_mask, dropout_p=dropout)
        out = out.transpose(1, 2).flatten(-2)
        if value_shift is not None:
            out = out + value_shift.to(out.dtype)
        out = self.out(out)
        if has_key is not None:
            out = out * has_key.to(out.dtype)
        return out


class _PreNormBlock(nn.Module):
    """Shared part of the blocks: input norms (named by ``norms``), the attention, ``norm2`` and the MLP."""

    def __init__(self, attention: MultiHeadAttention, dim: int, mlp_dim: int, norms: tuple[str, ...]) -> None:
        super().__init__()
        for name in norms:
            setattr(self, name, nn.LayerNorm(dim))
        self.attn = attention
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = mlp(dim, dim, mlp_dim)

    def mix(self, z: Tensor, update: Tensor) -> Tensor:
        """``z + update``, then the residual MLP."""
        z = z + update
        return z + self.mlp(self.norm2(z))

    def attend_located(
        self, zq: Tensor, q: Tensor, kv: Tensor, mask: Tensor | None, xq: Tensor | None, xk: Tensor | None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The residual update of ``zq`` from normalised ``q``, ``kv``; with locations also the moved ``xq``."""
        if xq is None:
            return self.mix(zq, self.attn(q, kv, mask))
        if not self.attn.located:
            raise ValueError(f"{type(self.attn).__name__} takes no locations; use TEAttention.")
        out, dx = self.attn(q, kv, xq, xq if xk is None else xk, mask)
        return self.mix(zq, out), xq if dx is None else xq + dx


class SelfAttentionBlock(_PreNormBlock):
    """Pre-norm residual MHSA + MLP on ``z [B, N, D]`` (key mask ``[B, N]`` or ``[B, N, N]``).

    ``attention``: a ``TEAttention`` (built by the caller) instead of plain multi-head attention; the block then
    takes the locations ``x [B, N, Dx]`` and returns ``(z, x)`` with ``x`` updated by eq. 10.
    """

    def __init__(
        self,
        dim: int = 128,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dropout: float = 0.0,
        attention: MultiHeadAttention | None = None,
    ) -> None:
        attention = attention or MultiHeadAttention(dim, heads, head_dim, dropout)
        super().__init__(attention, dim, mlp_dim, ("norm1",))

    def forward(self, z: Tensor, mask: Tensor | None = None, x: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """``z [B, N, D]`` -> ``[B, N, D]``; with ``x [B, N, Dx]`` (TE attention) -> ``(z, x)``."""
        h = self.norm1(z)
        return self.attend_located(z, h, h, mask, x, x)


class CrossAttentionBlock(_PreNormBlock):
    """Pre-norm residual MHCA + MLP: queries ``[B, Nq, D]`` attend to ``[B, Nk, D]`` (mask ``[B, Nk]``).

    ``attention``: as in ``SelfAttentionBlock``; with TE attention the block takes ``xq``, ``xk`` and returns
    ``(zq, xq)``.
    """

    def __init__(
        self,
        dim: int = 128,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dropout: float = 0.0,
        attention: MultiHeadAttention | None = None,
    ) -> None:
        attention = attention or MultiHeadAttention(dim, heads, head_dim, dropout)
        super().__init__(attention, dim, mlp_dim, ("norm_q", "norm_kv"))

    def forward(
        self, zq: Tensor, zkv: Tensor, mask: Tensor | None = None, xq: Tensor | None = None, xk: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``zq [B, Nq, D]``, ``zkv [B, Nk, D]`` -> ``[B, Nq, D]``; with ``xq``, ``xk`` (TE) -> ``(zq, xq)``."""
        return self.attend_located(zq, self.norm_q(zq), self.norm_kv(zkv), mask, xq, xk)

    def forward_standardised(self, zq: Tensor, nkv: Tensor, mask: Tensor | None = None) -> Tensor:
        """``forward(zq, zkv, mask)`` from ``nkv = standardise(zkv, norm_kv)``, which blocks that read the same
        ``zkv`` can share: ``norm_kv``'s affine is folded into the key and value weights. Plain attention only."""
        if self.attn.located:
            raise ValueError(f"forward_standardised takes plain attention; this block has {type(self.attn).__name__}.")
        return self.mix(zq, self.attn.attend_standardised(self.norm_q(zq), nkv, self.norm_kv, mask))


__all__ = [
    "CrossAttentionBlock",
    "MultiHeadAttention",
    "SelfAttentionBlock",
    "attention_mask",
    "explicit_attention",
    "few_keys",
    "masked_mean",
    "standardise",
]
