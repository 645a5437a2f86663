"""Translation-equivariant attention (TE-TNP, Ashman et al., ICML 2024, eqs. 7-8 and 10).

``TEAttention``: queries ``zq [B, Nq, D]`` at ``xq [B, Nq, Dx]`` attend to ``zk [B, Nk, D]`` at ``xk [B, Nk, Dx]``;
returns ``(out [B, Nq, D], dx [B, Nq, Dx] | None)``. Locations stay outside the tokens and the logit of query
``n`` and key ``m`` depends on the per-head dot product and on ``x_n - x_m`` through a small MLP ``rho``:

* ``variant="post"`` (eq. 8): ``logit_nm = rho(cat[q_n . k_m / sqrt(Dh) over heads, x_n - x_m])`` (``H + Dx -> H``);
* ``variant="pre"``:  ``logit_nm = q_n . k_m / sqrt(Dh) + rho(x_n - x_m)`` (``Dx -> H``), an additive bias;
* ``rotation=True``: ``rho`` sees ``||x_n - x_m||`` instead of the difference (rotation invariant too);
* ``update_locations=True`` (eq. 10): ``x_n <- x_n + C sum_m (x_n - x_m) phi(alpha_nm)`` with ``alpha_nm [H]`` the
  softmax attention weights of all heads, ``C = 1 / N`` (the number of valid keys) and ``phi`` an MLP ``H -> 1``.

Memory: ``rho`` runs on every (query, key) pair; queries are processed in chunks of at most ``max_pairs`` pairs
(``gridtnp.nn.chunking``), so the ``[B, Nq, Nk, rho_hidden]`` activations never exist at once. Each query row sees
all keys, so the softmax is exact; ``max_pairs=None`` is the unchunked reference. The pre-norm blocks of
``gridtnp.nn.attention`` take a ``TEAttention`` as their attention.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from gridtnp.nn.attention import MultiHeadAttention, attention_mask
from gridtnp.nn.chunking import DEFAULT_MAX_PAIRS, check_max_pairs, map_query_chunks
from gridtnp.nn.mlp import mlp

VARIANTS = ("post", "pre")


class TEAttention(MultiHeadAttention):
    """Multi-head TE attention: ``zq [B, Nq, D]`` at ``xq [B, Nq, Dx]`` attends to ``zk [B, Nk, D]`` at ``xk``.

    Returns the attention output ``[B, Nq, D]`` and, with ``update_locations``, the location update
    ``[B, Nq, Dx]`` (else None). See the module docstring for the variants; a query with no valid key gets a zero
    output and a zero location update.
    """

    located = True

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        variant: str = "post",
        rotation: bool = False,
        rho_hidden: int = 32,
        rho_layers: int = 2,
        update_locations: bool = False,
        max_pairs: int | None = DEFAULT_MAX_PAIRS,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"TE attention: variant must be one of {VARIANTS}; got {variant!r}.")
        check_max_pairs(max_pairs, "TE attention")
        super().__init__(dim, heads, head_dim)
        self.variant, self.rotation, self.max_pairs = variant, rotation, max_pairs
        rel_dim = 1 if rotation else dim_x
        self.rho = mlp(rel_dim if variant == "pre" else heads + rel_dim, heads, rho_hidden, rho_layers)
        self.phi = mlp(heads, 1, rho_hidden, 2) if update_locations else None

    def forward(  # type: ignore[override]
        self, zq: Tensor, zk: Tensor, xq: Tensor, xk: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [B, Nq, D], dx [B, Nq, Dx] | None)``; ``mask`` is ``[B, Nk]`` or ``[B, Nq, Nk]``."""
        q = self.split_heads(self.to_q(zq))
        k, v = self.project_kv(zk)
        nq, nk = q.shape[2], k.shape[2]
        attn_mask, has_key = attention_mask(mask, nq)  # [B, 1, Nq|1, Nk] with empty rows opened, [B, Nq, 1]
        key_mask = None if mask is None else (mask[:, None, :] if mask.dim() == 2 else mask)  # [B, Nq|1, Nk]

        def chunk(start: int, end: int) -> tuple[Tensor, Tensor | None]:
            rows = slice(start, end)
            am = None if attn_mask is None else attn_mask[:, :, rows] if attn_mask.shape[2] > 1 else attn_mask
            km = None if key_mask is None else key_mask[:, rows] if key_mask.shape[1] > 1 else key_mask
            diff = xq[:, rows].unsqueeze(2) - xk.unsqueeze(1)  # [B, nq, Nk, Dx]
            return self.attend_heads(q[:, :, rows], k, v, diff, am, km)

        pieces = map_query_chunks(chunk, nq, q.shape[0] * nk, self.max_pairs, cpu=q.device.type == "cpu")
        out = torch.cat([p[0] for p in pieces], dim=2) if len(pieces) > 1 else pieces[0][0]
        out = self.out(out.transpose(1, 2).flatten(-2))
        dx = None
        if self.phi is not None:
            dx = torch.cat([p[1] for p in pieces], dim=1) if len(pieces) > 1 else pieces[0][1]
        if has_key is not None:
            out = out * has_key.to(out.dtype)
        return out, dx

    def attend(  # type: ignore[override]
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, diff: Tensor
    ) -> Tensor:
        """Raw queries ``[B, Nq, D]`` to projected ``k, v [B, H, Nk, Dh]`` at offsets ``diff [B, Nq, Nk, Dx]``.

        For keys gathered per query (the k-NN decoder), with one key mask ``[B, Nk]``; no location update.
        """
        attn_mask, has_key = attention_mask(mask, q.shape[1])
        out, _ = self.attend_heads(self.split_heads(self.to_q(q)), k, v, diff, attn_mask, None)
        out = self.out(out.transpose(1, 2).flatten(-2))
        return out if has_key is None else out * has_key.to(out.dtype)

    def relative(self, diff: Tensor) -> Tensor:
        """What ``rho`` sees of the offsets ``[..., Dx]``: the offsets, or their length ``[..., 1]`` (rotation)."""
        if not self.rotation:
            return diff
        # sqrt has an infinite derivative at 0 (a point and itself): keep the gradient finite.
        return diff.square().sum(-1, keepdim=True).clamp_min(1e-12).sqrt()

    def logits(self, q: Tensor, k: Tensor, rel: Tensor) -> Tensor:
        """Logits ``[B, H, nq, Nk]`` from ``q [B, H, nq, Dh]``, ``k [B, H, Nk, Dh]`` and ``rel [B, nq, Nk, R]``."""
        dots = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        if self.variant == "pre":
            return dots + self.rho(rel.to(q.dtype)).permute(0, 3, 1, 2)
        features = torch.cat([dots.permute(0, 2, 3, 1), rel.to(dots.dtype)], dim=-1)  # [B, nq, Nk, H + R]
        return self.rho(features).permute(0, 3, 1, 2)

    def attend_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        diff: Tensor,
        attn_mask: Tensor | None,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """One chunk: ``q [B, H, nq, Dh]``, ``k, v [B, H, Nk, Dh]``, offsets ``diff [B, nq, Nk, Dx]``.

        ``attn_mask [B, 1, nq|1, Nk]`` has empty rows opened (see ``attention_mask``); ``key_mask [B, nq|1, Nk]``
        is the raw mask that weights the location update. Returns ``out [B, H, nq, Dh]`` and ``dx [B, nq, Dx]``.
        """
        rel = self.relative(diff)
        if self.variant == "pre" and self.phi is None:
            # A plain softmax over q.k / sqrt(Dh) + rho(x_n - x_m): SDPA with the bias as a float mask.
            bias = self.rho(rel.to(q.dtype)).permute(0, 3, 1, 2)
            if attn_mask is not None:
                bias = bias.masked_fill(~attn_mask, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype)), None
        logits = self.logits(q, k, rel)
        weights = logits.float()
        if attn_mask is not None:
            weights = weights.masked_fill(~attn_mask, float("-inf"))
        alpha = weights.softmax(-1)  # eq. 8's attention weights [B, H, nq, Nk]
        out = alpha.to(v.dtype) @ v
        if self.phi is None:
            return out, None
        # Eq. 10: x_n <- x_n + (1 / N) sum_m (x_n - x_m) phi(alpha_nm), over valid keys m only; phi sees the
        # softmax weights of all heads (not the logits), so a constant added to every logit changes nothing.
        w = self.phi(alpha.to(logits.dtype).permute(0, 2, 3, 1)).squeeze(-1).float()  # [B, nq, Nk]
        if key_mask is None:
            count = torch.full_like(w[..., :1], w.shape[-1])
        else:
            w = w * key_mask
            count = key_mask.sum(-1, keepdim=True).clamp_min(1).to(w.dtype)
        dx = (diff.float() * w.unsqueeze(-1)).sum(2) / count
        return out, dx.to(diff.dtype)


def te_attention(
    dim: int,
    dim_x: int,
    heads: int,
    head_dim: int,
    variant: str,
    rotation: bool,
    rho_hidden: int,
    update_locations: bool,
    max_pairs: int | None,
) -> Callable[[], TEAttention]:
    """A factory of identically configured ``TEAttention`` modules, one per block."""
    return partial(
        TEAttention,
        dim,
        dim_x,
        heads,
        head_dim,
        variant=variant,
        rotation=rotation,
        rho_hidden=rho_hidden,
        update_locations=update_locations,
        max_pairs=max_pairs,
    )


__all__ = ["VARIANTS", "TEAttention", "te_attention"]
