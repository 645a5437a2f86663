"""Attention of one query per segment to a variable number of keys, without padding to the fullest segment.

``segment_attention(q [R, H, Dh], k [E, H, Dh], v [E, H, Dh], segment [E], keep [E], own=(k_R, v_R))`` returns
``(out [R, H, Dh], has_key [R])``: query ``r`` attends to the entries ``e`` with ``segment[e] == r`` and ``keep[e]``
(and, with ``own``, to one more key/value of its own, ``[R, H, Dh]`` each): a softmax over ``q_r . k_e / sqrt(Dh)``
per head. A segment with no key gets a zero output and ``has_key`` False.

This is the PT-GE's cross-attention from each grid cell's pseudo-token to the context tokens in its cell: the
cells hold different numbers of tokens, and a padded ``[R, S_max, D]`` buffer for one SDPA call is mostly padding
(a Poisson cell count's maximum is 2-3 x its mean) and costs a full-size fill, gather and scatter in the backward
pass. Here every step is one pass over the ``E`` entries (gathers and ``index_add``, whose backward passes are
gathers again) and no host sync is needed. The softmax subtracts each segment's maximum logit (without gradient:
the result does not depend on the shift) and sums in float32 or wider.
"""

from __future__ import annotations

import torch
from torch import Tensor


def segment_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    segment: Tensor,
    keep: Tensor | None = None,
    own: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-segment softmax attention: ``q [R, H, Dh]``, ``k, v [E, H, Dh]``, ``segment [E]`` in ``[0, R)``.

    ``keep [E]``: entries that take part (default all); ``own``: each segment's own key and value ``[R, H, Dh]``.
    Returns ``out [R, H, Dh]`` (zero for a segment without any key) and ``has_key [R]``.
    """
    num, heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[1:] != q.shape[1:] or segment.shape != k.shape[:1]:
        raise ValueError(
            f"segment_attention: needs q [R, H, Dh], k and v [E, H, Dh], segment [E]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(segment.shape)}."
        )
    dtype = torch.promote_types(q.dtype, torch.float32)  # softmax sums in float32 even under bf16
    scale = head_dim**-0.5
    logits = (q.index_select(0, segment) * k).to(dtype).sum(-1) * scale  # [E, H]
    if keep is not None:
        logits = logits.masked_fill(~keep.unsqueeze(-1), float("-inf"))
    index = segment.unsqueeze(-1).expand(-1, heads)
    own_logits = None if own is None else (q * own[0]).to(dtype).sum(-1) * scale  # [R, H]
    with torch.no_grad():
        start = logits.new_full((num, heads), float("-inf")) if own_logits is None else own_logits.detach()
        peak = start.scatter_reduce(0, index, logits, "amax")
        peak = torch.where(torch.isfinite(peak), peak, 0.0)  # a segment without keys: any finite shift
    weights = torch.exp(logits - peak.index_select(0, segment))  # [E, H], in [0, 1]
    total = weights.new_zeros(num, heads).index_add(0, segment, weights)  # [R, H]: >= 1 where a segment has keys
    out = weights.new_zeros(num, heads, head_dim).index_add(0, segment, weights.unsqueeze(-1) * v.to(dtype))
    if own is not None:
        own_weights = torch.exp(own_logits - peak)
        total = total + own_weights
        out = out + own_weights.unsqueeze(-1) * own[1].to(dtype)
    has_key = total > 0
    out = out / torch.where(has_key, total, 1.0).unsqueeze(-1)
    return out.to(q.dtype), has_key[:, 0]


__all__ = ["segment_attention"]
