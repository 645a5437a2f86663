"""Attention with one query per set of keys, outside SDPA: fixed-size neighbourhoods and variable-size segments.

* ``neighbour_attention(q [N, H, Dh], k [N, K, H, Dh], v [N, K, H, Dh], mask [N, K], bias [N, K, H])`` ->
  ``[N, H, Dh]``: query ``n`` attends to its own ``K`` keys (the k-NN grid decoder: each target to its gathered grid
  tokens). On the CPU, SDPA's flash kernel costs about twice these few element-wise passes for one query and
  ``K = 9`` keys, forward and backward, and it wants a per-head ``[N, H, K, Dh]`` layout whose gather backward is
  a slow 16-wide scatter; here keys stay in the gathered ``[N, K, H Dh]`` rows.
* ``segment_attention(q [R, H, Dh], k [E, H, Dh], v [E, H, Dh], segment [E], keep [E], own=(k_R, v_R))`` ->
  ``(out [R, H, Dh], has_key [R])``: query ``r`` attends to the entries ``e`` with ``segment[e] == r`` and
  ``keep[e]`` (and, with ``own``, to one more key/value of its own, ``[R, H, Dh]`` each). This is the PT-GE's
  cross-attention from each grid cell's pseudo-token to the context tokens in its cell: the cells hold different
  numbers of tokens, and a padded ``[R, S_max, D]`` buffer for one SDPA call is mostly padding (a Poisson cell
  count's maximum is 2-3 x its mean) and costs a full-size fill, gather and scatter in the backward pass. Here
  every step is one pass over the ``E`` entries (gathers and ``index_add``, whose backward passes are gathers
  again) and no host sync is needed.

Both compute ``softmax(q . k / sqrt(Dh) + bias)`` per head, in float32 or wider, and give a query with no valid key
a zero output (``neighbour_attention``: zero; ``segment_attention``: zero and ``has_key`` False). The segment softmax
subtracts each segment's maximum logit without gradient (the result does not depend on the shift).
"""

from __future__ import annotations

import torch
from torch import Tensor


def neighbour_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    """Each query ``q [N, H, Dh]`` attends to its own keys/values ``k, v [N, K, H, Dh]`` -> ``[N, H, Dh]``.

    ``mask [N, K]`` (True = attend) and ``bias [N, K, H]`` (added to the logits) are optional; a query whose keys
    are all masked gets a zero output.
    """
    n, _, head_dim = q.shape
    if k.shape != v.shape or k.dim() != 4 or k.shape[0] != n or k.shape[2:] != q.shape[1:]:
        raise ValueError(
            f"neighbour_attention: needs q [N, H, Dh] and k, v [N, K, H, Dh]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}."
        )
    dtype = torch.promote_types(q.dtype, torch.float32)  # softmax in float32 even under bf16
    logits = (q.unsqueeze(1) * k).to(dtype).sum(-1) * head_dim**-0.5  # [N, K, H]
    if bias is not None:
        logits = logits + bias.to(dtype)
    has_key = None
    if mask is not None:
        has_key = mask.any(-1, keepdim=True)  # [N, 1]
        logits = logits.masked_fill(~(mask | ~has_key).unsqueeze(-1), float("-inf"))  # no key: attend to all, then 0
    weights = logits.softmax(1).unsqueeze(-1)  # [N, K, H, 1]
    out = (weights * v.to(dtype)).sum(1)  # [N, H, Dh]
    if has_key is not None:
        out = out * has_key.unsqueeze(-1).to(dtype)
    return out.to(q.dtype)


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


__all__ = ["neighbour_attention", "segment_attention"]
