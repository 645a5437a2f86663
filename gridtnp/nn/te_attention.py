"""Translation-equivariant (TE) attention and the TE-MHSA / TE-MHCA blocks of TE-TNPs (Ashman et al., ICML 2024).

Ordinary attention reads input locations only through the tokens. TE attention keeps locations ``x`` outside the
tokens and lets the attention logit of query ``n`` and key ``m`` depend on the per-head dot product and on the
difference ``x_n - x_m`` through a small MLP ``rho`` (TE-TNP eqs. 7-8):

* ``variant="post"``: ``logit_nm = rho(cat[q_n . k_m / sqrt(Dh) over heads, x_n - x_m])`` (``H + Dx -> H``);
* ``variant="pre"``:  ``logit_nm = q_n . k_m / sqrt(Dh) + rho(x_n - x_m)`` (``Dx -> H``), an additive bias;
* ``rotation=True``: ``rho`` sees ``||x_n - x_m||`` instead of the difference, so attention is also invariant to
  rotations (and reflections) of all inputs;
* ``update_locations=True`` (eq. 10): ``x_n <- x_n + C sum_m (x_n - x_m) phi(logit_nm)`` with ``C = 1 / N`` (the
  number of valid keys) and ``phi`` an MLP ``H -> 1``; translation (and rotation) equivariant.

Shifting every location by the same vector leaves every logit unchanged, so a model built only from these blocks
and location-free token initialisations is translation equivariant.

Memory: ``rho`` runs on every (query, key) pair, so a naive implementation holds ``[B, Nq, Nk, rho_hidden]``
activations, and for training all of them per layer. Here queries are processed in chunks of at most
``max_pairs // (B Nk)`` rows (at least one row), each chunk under ``torch.utils.checkpoint`` when gradients are
needed, so forward and backward hold the pair tensors of one chunk at a time: ``O(max(max_pairs, B Nk) rho_hidden)``
whatever ``Nq`` is.
Each query row sees all keys, so the softmax is exact and results equal the unchunked computation up to float
rounding. ``max_pairs=None`` is the naive, unchunked reference. On the CPU, freed heap pages are returned to the OS
every few chunks (``release_cpu_memory``), so that the process's resident memory stays bounded too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from gridtnp.nn.attention import _attention_mask, mlp

T = TypeVar("T")

VARIANTS = ("post", "pre")
#: Default bound on the (batch item, query, key) triples held at once: ~0.5 KB each with the default rho (~30 MB).
DEFAULT_MAX_PAIRS = 2**16


#: On the CPU, freed heap pages are handed back to the OS after every this many chunks (see ``release_cpu_memory``).
RELEASE_EVERY = 16


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` where the C library has it (Linux), else None."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_cpu_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim(0)``; a no-op elsewhere).

    glibc raises its mmap threshold once a large block has been freed, so the next chunks' tensors of a few MB come
    from the heap, and small long-lived allocations made between chunks (outputs, autograd nodes) fragment it: freed
    chunk buffers then stay resident and the process's memory grows with the number of chunks although the live
    tensors do not. Trimming every ``RELEASE_EVERY`` chunks keeps the resident size bounded.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def map_query_chunks(
    fn: Callable[[int, int], T], num_queries: int, num_keys: int, max_pairs: int | None, cpu: bool = False
) -> list[T]:
    """``[fn(start, end), ...]`` over query ranges of at most ``max(1, max_pairs // num_keys)`` rows.

    ``num_keys`` is what one query row costs in pairs (``B * Nk`` for a batch).

    With more than one chunk and gradients enabled, each call runs under ``torch.utils.checkpoint`` (non-reentrant),
    so its intermediate tensors are recomputed in the backward pass instead of being stored. ``max_pairs=None``:
    one call, no checkpoint. With ``cpu``, ``release_cpu_memory`` runs every ``RELEASE_EVERY`` chunks, in the
    forward pass and in the backward pass's recomputation alike.
    """
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None (unchunked); got {max_pairs}.")
    step = num_queries if max_pairs is None else max(1, max_pairs // max(num_keys, 1))
    step = max(step, 1)
    if step >= num_queries:
        return [fn(0, num_queries)]

    def run(start: int, end: int) -> T:
        if cpu and (start // step) % RELEASE_EVERY == RELEASE_EVERY - 1:
            release_cpu_memory()
        return fn(start, end)

    use_checkpoint = torch.is_grad_enabled()
    out = []
    for start in range(0, num_queries, step):  # a loop over chunks of queries, not over points
        end = min(start + step, num_queries)
        if use_checkpoint:
            out.append(checkpoint(run, start, end, use_reentrant=False, preserve_rng_state=False))
        else:
            out.append(run(start, end))
    return out


def relative_features(xq: Tensor, xk: Tensor, rotation: bool) -> tuple[Tensor, Tensor]:
    """Differences ``x_q - x_k [B, Nq, Nk, Dx]`` and what rho sees: the difference, or its norm ``[.., 1]``."""
    diff = xq.unsqueeze(2) - xk.unsqueeze(1)
    if not rotation:
        return diff, diff
    # sqrt has an infinite derivative at 0 (a point and itself): keep the gradient finite.
    return diff, diff.square().sum(-1, keepdim=True).clamp_min(1e-12).sqrt()


class TEAttention(nn.Module):
    """Multi-head TE attention: ``zq [B, Nq, D]`` at ``xq [B, Nq, Dx]`` attends to ``zk [B, Nk, D]`` at ``xk``.

    Returns the attention output ``[B, Nq, D]`` and, with ``update_locations``, the location update
    ``[B, Nq, Dx]`` (else None). ``mask`` is a key mask ``[B, Nk]`` or ``[B, Nq, Nk]`` (True = attend); a query
    with no valid key gets a zero output and a zero location update.
    """

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
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"TE attention: variant must be one of {VARIANTS}; got {variant!r}.")
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"TE attention: max_pairs must be >= 1 or None (unchunked); got {max_pairs}.")
        inner = heads * head_dim
        self.heads, self.head_dim, self.variant, self.rotation = heads, head_dim, variant, rotation
        self.max_pairs = max_pairs
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.out = nn.Linear(inner, dim)
        rel_dim = 1 if rotation else dim_x
        rho_in = rel_dim if variant == "pre" else heads + rel_dim
        self.rho = mlp(rho_in, heads, rho_hidden, rho_layers)
        self.phi = mlp(heads, 1, rho_hidden, 2) if update_locations else None

    def split_heads(self, t: Tensor) -> Tensor:
        """``[B, N, H*Dh]`` -> ``[B, H, N, Dh]``."""
        return t.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(
        self, zq: Tensor, zk: Tensor, xq: Tensor, xk: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [B, Nq, D], dx [B, Nq, Dx] | None)``; see the class docstring."""
        q = self.split_heads(self.to_q(zq))
        k, v = (self.split_heads(t) for t in self.to_kv(zk).chunk(2, dim=-1))
        nq, nk = q.shape[2], k.shape[2]
        attn_mask, has_key = _attention_mask(mask, nq)  # [B, 1, Nq|1, Nk] with empty rows opened, [B, Nq, 1]
        key_mask = None if mask is None else (mask[:, None, :] if mask.dim() == 2 else mask)  # [B, Nq|1, Nk]

        def chunk(start: int, end: int) -> tuple[Tensor, Tensor | None]:
            rows = slice(start, end)
            am = None if attn_mask is None else attn_mask[:, :, rows] if attn_mask.shape[2] > 1 else attn_mask
            km = None if key_mask is None else key_mask[:, rows] if key_mask.shape[1] > 1 else key_mask
            return self.attend(q[:, :, rows], k, v, xq[:, rows], xk, am, km)

        pieces = map_query_chunks(chunk, nq, q.shape[0] * nk, self.max_pairs, cpu=q.device.type == "cpu")
        out = torch.cat([p[0] for p in pieces], dim=2) if len(pieces) > 1 else pieces[0][0]
        out = self.out(out.transpose(1, 2).flatten(-2))
        dx = None
        if self.phi is not None:
            dx = torch.cat([p[1] for p in pieces], dim=1) if len(pieces) > 1 else pieces[0][1]
        if has_key is not None:
            out = out * has_key.to(out.dtype)
        return out, dx

    def logits(self, q: Tensor, k: Tensor, rel: Tensor) -> Tensor:
        """Logits ``[B, H, nq, Nk]`` from ``q [B, H, nq, Dh]``, ``k [B, H, Nk, Dh]`` and ``rel [B, nq, Nk, R]``."""
        dots = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        if self.variant == "pre":
            return dots + self.rho(rel.to(q.dtype)).permute(0, 3, 1, 2)
        features = torch.cat([dots.permute(0, 2, 3, 1), rel.to(dots.dtype)], dim=-1)  # [B, nq, Nk, H + R]
        return self.rho(features).permute(0, 3, 1, 2)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        xq: Tensor,
        xk: Tensor,
        attn_mask: Tensor | None,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """One chunk: ``q [B, H, nq, Dh]``, ``k, v [B, H, Nk, Dh]``, ``xq [B, nq, Dx]``, ``xk [B, Nk, Dx]``.

        ``attn_mask [B, 1, nq|1, Nk]`` has empty rows opened (see ``_attention_mask``); ``key_mask [B, nq|1, Nk]``
        is the raw mask used to weight the location update. Returns ``out [B, H, nq, Dh]`` and ``dx [B, nq, Dx]``.
        """
        diff, rel = relative_features(xq, xk, self.rotation)
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
        out = weights.softmax(-1).to(v.dtype) @ v
        if self.phi is None:
            return out, None
        # Eq. 10: x_n <- x_n + (1 / N) sum_m (x_n - x_m) phi(logit_nm), over valid keys m only.
        w = self.phi(logits.permute(0, 2, 3, 1)).squeeze(-1).float()  # [B, nq, Nk]
        if key_mask is None:
            count = torch.full_like(w[..., :1], w.shape[-1])
        else:
            w = w * key_mask
            count = key_mask.sum(-1, keepdim=True).clamp_min(1).to(w.dtype)
        dx = (diff.float() * w.unsqueeze(-1)).sum(2) / count
        return out, dx.to(xq.dtype)


class TESelfAttentionBlock(nn.Module):
    """Pre-norm residual TE-MHSA + MLP: ``(z [B, N, D], x [B, N, Dx])`` -> updated ``(z, x)``; mask ``[B, N]``."""

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        **te: object,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TEAttention(dim, dim_x, heads, head_dim, **te)  # type: ignore[arg-type]
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = mlp(dim, dim, mlp_dim)

    def forward(self, z: Tensor, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``z [B, N, D]``, ``x [B, N, Dx]``, ``mask [B, N]`` -> ``(z, x)`` of the same shapes."""
        h = self.norm1(z)
        out, dx = self.attn(h, h, x, x, mask)
        z = z + out
        z = z + self.mlp(self.norm2(z))
        return z, x if dx is None else x + dx


class TECrossAttentionBlock(nn.Module):
    """Pre-norm residual TE-MHCA + MLP: queries ``(zq [B, Nq, D], xq)`` attend to ``(zk [B, Nk, D], xk)``."""

    def __init__(
        self,
        dim: int = 128,
        dim_x: int = 1,
        heads: int = 8,
        head_dim: int = 16,
        mlp_dim: int = 128,
        **te: object,
    ) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = TEAttention(dim, dim_x, heads, head_dim, **te)  # type: ignore[arg-type]
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = mlp(dim, dim, mlp_dim)

    def forward(
        self, zq: Tensor, xq: Tensor, zk: Tensor, xk: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``zq [B, Nq, D]`` at ``xq [B, Nq, Dx]``, keys at ``xk``, ``mask [B, Nk]`` -> updated ``(zq, xq)``."""
        out, dx = self.attn(self.norm_q(zq), self.norm_kv(zk), xq, xk, mask)
        zq = zq + out
        zq = zq + self.mlp(self.norm2(zq))
        return zq, xq if dx is None else xq + dx


__all__ = [
    "DEFAULT_MAX_PAIRS",
    "VARIANTS",
    "TEAttention",
    "TECrossAttentionBlock",
    "TESelfAttentionBlock",
    "map_query_chunks",
    "relative_features",
]
