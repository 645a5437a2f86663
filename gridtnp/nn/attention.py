"""Multi-head attention and the pre-norm residual MHSA / MHCA blocks used by every transformer here.

Defaults follow the TNP papers: ``D_z = 128``, 8 heads of 16 dimensions, feed-forward width 128.
All attention goes through ``F.scaled_dot_product_attention``. Masks are boolean, ``True`` = attend.
A query with no valid key (an empty context) gets a zero attention output rather than NaN.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def mlp(
    dim_in: int, dim_out: int, hidden: int, layers: int = 2, activation: type[nn.Module] = nn.GELU
) -> nn.Sequential:
    """An MLP with ``layers`` linear layers (``layers - 1`` hidden layers of width ``hidden``)."""
    if layers < 1:
        raise ValueError(f"mlp needs at least one layer; got layers={layers}.")
    dims = [dim_in] + [hidden] * (layers - 1) + [dim_out]
    modules: list[nn.Module] = []
    for i in range(layers):
        modules.append(nn.Linear(dims[i], dims[i + 1]))
        if i < layers - 1:
            modules.append(activation())
    return nn.Sequential(*modules)


def _attention_mask(mask: Tensor | None, num_queries: int) -> tuple[Tensor | None, Tensor | None]:
    """Broadcast a key mask ``[B, Nk]`` or ``[B, Nq, Nk]`` to SDPA's ``[B, 1, Nq|1, Nk]``.

    Returns the mask with empty rows opened up (so softmax is finite) and a ``[B, Nq, 1]``
    indicator of queries that had at least one valid key, or ``(None, None)``.
    """
    if mask is None:
        return None, None
    if mask.dim() == 2:
        mask = mask[:, None, :]  # [B, 1, Nk]
    has_key = mask.any(-1, keepdim=True)  # [B, Nq|1, 1]
    # Rows with no valid key would give softmax over all -inf = NaN: let them attend to everything,
    # then zero their output, so values and gradients stay finite. No host sync is needed.
    safe = mask | ~has_key
    return safe[:, None], has_key.expand(-1, num_queries, -1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: queries ``[B, Nq, D]``, keys/values ``[B, Nk, D]`` -> ``[B, Nq, D]``."""

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

    def project_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, H, Nk, Dh]`` each (exposed so callers can project once and gather)."""
        k, v = self.to_kv(kv).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(self, q: Tensor, kv: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attend from ``q [B, Nq, D]`` to ``kv [B, Nk, D]``; ``mask`` is ``[B, Nk]`` or ``[B, Nq, Nk]``."""
        k, v = self.project_kv(kv)
        return self.attend(q, k, v, mask)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attention from raw queries ``[B, Nq, D]`` to projected ``k, v [B, H, Nk, Dh]``."""
        qh = self.split_heads(self.to_q(q))
        attn_mask, has_key = _attention_mask(mask, q.shape[1])
        out = F.scaled_dot_product_attention(
            qh, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        out = self.out(out.transpose(1, 2).flatten(-2))
        if has_key is not None:
            out = out * has_key.to(out.dtype)
        return out


class SelfAttentionBlock(nn.Module):
    """Pre-norm residual MHSA + MLP on ``[B, N, D]`` with an optional key mask ``[B, N]``."""

    def __init__(
        self, dim: int = 128, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, head_dim, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = mlp(dim, dim, mlp_dim)

    def forward(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        """``z [B, N, D]`` -> ``[B, N, D]``; ``mask`` is ``[B, N]`` or ``[B, N, N]``."""
        h = self.norm1(z)
        z = z + self.attn(h, h, mask)
        return z + self.mlp(self.norm2(z))


class CrossAttentionBlock(nn.Module):
    """Pre-norm residual MHCA + MLP: queries ``[B, Nq, D]`` attend to ``[B, Nk, D]`` (mask ``[B, Nk]``)."""

    def __init__(
        self, dim: int = 128, heads: int = 8, head_dim: int = 16, mlp_dim: int = 128, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, head_dim, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = mlp(dim, dim, mlp_dim)

    def forward(self, zq: Tensor, zkv: Tensor, mask: Tensor | None = None) -> Tensor:
        """``zq [B, Nq, D]``, ``zkv [B, Nk, D]`` -> ``[B, Nq, D]``; ``mask`` is ``[B, Nk]`` or ``[B, Nq, Nk]``."""
        zq = zq + self.attn(self.norm_q(zq), self.norm_kv(zkv), mask)
        return zq + self.mlp(self.norm2(zq))


def masked_mean(z: Tensor, mask: Tensor | None, dim: int = 1) -> Tensor:
    """Mean of ``z [B, N, D]`` over valid points (``mask [B, N]``); zeros for an empty set."""
    if mask is None:
        return z.mean(dim)
    w = mask.to(z.dtype).unsqueeze(-1)
    return (z * w).sum(dim) / w.sum(dim).clamp(min=1.0)


__all__ = [
    "CrossAttentionBlock",
    "MultiHeadAttention",
    "SelfAttentionBlock",
    "masked_mean",
    "mlp",
]
