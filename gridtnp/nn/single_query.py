"""Attention with one query per set of keys, outside SDPA: fixed-size neighbourhoods and variable-size segments.

* ``neighbour_attention(q [N, H, Dh], keys [R, H Dh], values [R, H Dh], index [N, K], mask [N, K], bias [N, K, H])``
  -> ``[N, H, Dh]``: query ``n`` attends to its own ``K`` rows ``index[n]`` of the key and value tables (the k-NN
  grid decoder: each target to its ``K`` nearest grid tokens, projected once on the grid). On the CPU, SDPA's flash
  kernel costs about twice a few element-wise passes for one query and ``K = 9`` keys. As autograd ops those passes
  move about ten ``[N, K, H, Dh]`` tensors through memory; a custom autograd function runs forward and backward in
  chunks of queries small enough to stay in cache, gathers the rows again in the backward pass instead of saving
  them, and saves only the ``[N, K, H]`` attention weights (the headline Swin-TNP's forward+backward step: about
  10 % faster, and about 18 MB less saved per decoder block at ``N_t = 1,000``, batch 2).
* ``segment_attention(q [R, H, Dh], k [E, H, Dh], v [E, H, Dh], segment [E], keep [E], own=(k_R, v_R))`` ->
  ``(out [R, H, Dh], has_key [R])``: query ``r`` attends to the entries ``e`` with ``segment[e] == r`` and
  ``keep[e]`` (and, with ``own``, to one more key/value of its own, ``[R, H, Dh]`` each). This is the PT-GE's
  cross-attention from each grid cell's pseudo-token to the context tokens in its cell: the cells hold different
  numbers of tokens, and a padded ``[R, S_max, D]`` buffer for one SDPA call is mostly padding (a Poisson cell
  count's maximum is 2-3 x its mean) and costs a full-size fill, gather and scatter in the backward pass. Here
  every step is one pass over the ``E`` entries (gathers and ``index_add``) and no host sync is needed; a custom
  autograd function goes over the entries in chunks, so its ``[E, H, Dh]`` products never exist at full size
  (at a million context points each would be 1 GB, and every fresh allocation of that size is paid again in
  page faults).

Both compute ``softmax(q . k / sqrt(Dh) + bias)`` per head, in float32 or wider, and give a query with no valid key
a zero output (``neighbour_attention``: zero; ``segment_attention``: zero and ``has_key`` False). The segment softmax
subtracts each segment's maximum logit without gradient (the result does not depend on the shift).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Rows per step on the CPU, about 1 MB of float32: targets of ``neighbour_attention`` ([n, K, H Dh] gathered rows) and
# entries of ``segment_attention`` ([n, H, Dh]), so each chunk's keys, values, products and their gradients stay in
# cache instead of streaming through memory (2^16 to 2^20 measured; 2^18 was fastest). On a GPU: one step.
CPU_CHUNK_ELEMENTS = 2**18


def neighbour_attention(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    index: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    key_offset: Tensor | None = None,
    value_offset: Tensor | None = None,
) -> Tensor:
    """Query ``q [N, H, Dh]`` attends to its rows ``index [N, K]`` of ``keys, values [R, H Dh]`` -> ``[N, H, Dh]``.

    ``mask [N, K]`` (True = attend) and ``bias [N, K, H]`` (added to the logits) are optional; ``key_offset`` and
    ``value_offset [N, K, H, Dh]`` are added to the gathered keys and values (a relative-position embedding). A query
    whose keys are all masked gets a zero output. Every ``index`` entry must be a valid row, masked or not.
    """
    n, heads, head_dim = q.shape
    width = heads * head_dim
    if index.dim() != 2 or index.shape[0] != n:
        raise ValueError(f"neighbour_attention: needs index [N, K] with N = {n} queries; got {tuple(index.shape)}.")
    if keys.shape != values.shape or keys.dim() != 2 or keys.shape[1] != width:
        raise ValueError(
            f"neighbour_attention: needs keys and values [R, H Dh] = [R, {width}] for q {tuple(q.shape)}; got "
            f"{tuple(keys.shape)} and {tuple(values.shape)}."
        )
    pair = (n, index.shape[1], heads, head_dim)
    for name, t in (("key_offset", key_offset), ("value_offset", value_offset)):
        if t is not None and tuple(t.shape) != pair:
            raise ValueError(f"neighbour_attention: {name} must be [N, K, H, Dh] = {list(pair)}; got {tuple(t.shape)}.")
    chunk = _chunk_rows(index.shape[1] * width, n, q.device)
    return _NeighbourAttention.apply(q, keys, values, index, mask, bias, key_offset, value_offset, chunk)


def _chunk_rows(row_elements: int, rows: int, device: torch.device) -> int:
    """Rows per step: ``CPU_CHUNK_ELEMENTS`` worth on the CPU, all ``rows`` at once elsewhere (at least 1)."""
    if device.type == "cpu":
        return max(1, CPU_CHUNK_ELEMENTS // max(1, row_elements))
    return max(1, rows)


def _cast(t: Tensor | None, like: Tensor | None) -> Tensor | None:
    """A gradient ``t`` in the dtype of the input ``like`` it belongs to (None where either is None)."""
    return None if t is None or like is None else t.to(like.dtype)


def _gather(table: Tensor, index: Tensor, offset: Tensor | None, head_shape: tuple[int, int]) -> Tensor:
    """Rows ``index [n, K]`` of ``table [R, H Dh]`` as ``[n, K, H, Dh]``, plus ``offset`` when given."""
    rows = table.index_select(0, index.reshape(-1)).view(*index.shape, *head_shape)
    return rows if offset is None else rows + offset


class _NeighbourAttention(torch.autograd.Function):
    """``neighbour_attention`` in chunks of queries, forward and backward; only the attention weights are saved.

    As autograd ops, the gathered ``[N, K, H, Dh]`` keys and values, their products and gradients (about ten tensors
    of that size per call) go through memory; here each chunk's stay in cache, and the backward pass gathers the
    rows again (cheap: the tables are small) and adds the row gradients into the tables with ``index_add_``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        index: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        key_offset: Tensor | None,
        value_offset: Tensor | None,
        chunk: int,
    ) -> Tensor:
        n, kk = index.shape
        head_shape = tuple(q.shape[1:])
        dtype = torch.promote_types(q.dtype, torch.float32)  # softmax in float32 even under bf16
        scale = q.shape[-1] ** -0.5
        has_key = None if mask is None else mask.any(-1, keepdim=True)  # [N, 1]
        out = q.new_empty(q.shape, dtype=dtype)
        weights = q.new_empty(n, kk, q.shape[1], dtype=dtype)
        for start in range(0, n, chunk):  # loop over chunks of queries, not queries
            rows = slice(start, start + chunk)
            k = _gather(keys, index[rows], None if key_offset is None else key_offset[rows], head_shape)
            logits = (k * q[rows].unsqueeze(1)).to(dtype).sum(-1).mul_(scale)  # [n, K, H]
            if bias is not None:
                logits += bias[rows].to(dtype)
            if mask is not None:  # a query without keys attends to all of them, then its output is zeroed
                logits.masked_fill_(~(mask[rows] | ~has_key[rows]).unsqueeze(-1), float("-inf"))
            w = weights[rows] = logits.softmax(1)
            v = _gather(values, index[rows], None if value_offset is None else value_offset[rows], head_shape)
            out[rows] = (v.to(dtype) * w.unsqueeze(-1)).sum(1)
        if has_key is not None:
            out *= has_key.unsqueeze(-1)
        ctx.save_for_backward(q, keys, values, index, weights, has_key, key_offset, value_offset)
        ctx.scale, ctx.chunk = scale, chunk
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, keys, values, index, weights, has_key, key_offset, value_offset = ctx.saved_tensors
        need_q, need_k, need_v, _, _, need_bias, need_ko, need_vo, _ = ctx.needs_input_grad
        head_shape, width, dtype = tuple(q.shape[1:]), keys.shape[1], weights.dtype
        grad = grad.to(dtype)
        if has_key is not None:
            grad = grad * has_key.unsqueeze(-1)
        dq = torch.empty_like(q, dtype=dtype) if need_q else None
        dk = torch.zeros_like(keys, dtype=dtype) if need_k else None
        dv = torch.zeros_like(values, dtype=dtype) if need_v else None
        dbias = torch.empty_like(weights) if need_bias else None
        dko = torch.empty_like(key_offset, dtype=dtype) if need_ko else None
        dvo = torch.empty_like(value_offset, dtype=dtype) if need_vo else None
        for start in range(0, index.shape[0], ctx.chunk):  # loop over chunks of queries, not queries
            rows = slice(start, start + ctx.chunk)
            flat = index[rows].reshape(-1)
            g, w = grad[rows].unsqueeze(1), weights[rows]  # [n, 1, H, Dh], [n, K, H]
            v = _gather(values, index[rows], None if value_offset is None else value_offset[rows], head_shape)
            dw = (v.to(dtype) * g).sum(-1)  # [n, K, H]
            dlogits = w * (dw - (w * dw).sum(1, keepdim=True))  # softmax backward over the K keys
            if dbias is not None:
                dbias[rows] = dlogits
            if dv is not None or dvo is not None:
                dv_rows = w.unsqueeze(-1) * g  # [n, K, H, Dh]
                if dv is not None:
                    dv.index_add_(0, flat, dv_rows.view(-1, width))
                if dvo is not None:
                    dvo[rows] = dv_rows
            dlogits = dlogits.mul_(ctx.scale).unsqueeze(-1)  # [n, K, H, 1]
            if dq is not None:
                k = _gather(keys, index[rows], None if key_offset is None else key_offset[rows], head_shape)
                dq[rows] = (k.to(dtype) * dlogits).sum(1)
            if dk is not None or dko is not None:
                dk_rows = dlogits * q[rows].unsqueeze(1).to(dtype)  # [n, K, H, Dh]
                if dk is not None:
                    dk.index_add_(0, flat, dk_rows.view(-1, width))
                if dko is not None:
                    dko[rows] = dk_rows
        dbias = None if dbias is None else dbias.to(ctx.bias_dtype)
        offsets = _cast(dko, key_offset), _cast(dvo, value_offset)
        return _cast(dq, q), _cast(dk, keys), _cast(dv, values), None, None, dbias, *offsets, None


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
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != q.shape[1:] or segment.shape != k.shape[:1]:
        raise ValueError(
            f"segment_attention: needs q [R, H, Dh], k and v [E, H, Dh], segment [E]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(segment.shape)}."
        )
    chunk = _chunk_rows(q.shape[1] * q.shape[2], k.shape[0], q.device)
    own_k, own_v = (None, None) if own is None else own
    return _SegmentAttention.apply(q, k, v, segment, keep, own_k, own_v, chunk)


class _SegmentAttention(torch.autograd.Function):
    """``segment_attention`` over chunks of entries, forward and backward; saves the ``[E, H]`` probabilities.

    Forward: the logits of all entries (chunk by chunk, ``[E, H]``), each segment's maximum (no gradient: the result
    does not depend on the shift), then the probability-weighted values added into their segments chunk by chunk.
    Backward, with ``p`` the probabilities and ``g`` the output gradient of an entry's segment: ``dv = p g``,
    ``dlogit = p (g . v - g . out)`` (``out`` sums ``p v`` over the segment), ``dk = dlogit q / sqrt(Dh)`` and ``dq``
    sums ``dlogit k / sqrt(Dh)`` over the segment. No ``[E, H, Dh]`` product outlives its chunk, so a million context
    tokens do not allocate several full-size temporaries.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        segment: Tensor,
        keep: Tensor | None,
        own_k: Tensor | None,
        own_v: Tensor | None,
        chunk: int,
    ) -> tuple[Tensor, Tensor]:
        num, heads, head_dim = q.shape
        dtype = torch.promote_types(q.dtype, torch.float32)  # softmax sums in float32 even under bf16
        scale = head_dim**-0.5
        entries = k.shape[0]
        logits = q.new_empty(entries, heads, dtype=dtype)
        for start in range(0, entries, chunk):  # loop over chunks of entries, not entries
            rows = slice(start, start + chunk)
            logits[rows] = (q.index_select(0, segment[rows]) * k[rows]).to(dtype).sum(-1)
        logits *= scale
        if keep is not None:
            logits.masked_fill_(~keep.unsqueeze(-1), float("-inf"))
        own_logits = None if own_k is None else (q * own_k).to(dtype).sum(-1) * scale  # [R, H]
        start_value = logits.new_full((num, heads), float("-inf")) if own_logits is None else own_logits
        peak = start_value.scatter_reduce(0, segment.unsqueeze(-1).expand(-1, heads), logits, "amax")
        peak = torch.where(torch.isfinite(peak), peak, 0.0)  # a segment without keys: any finite shift
        weights = torch.exp(logits - peak.index_select(0, segment))  # [E, H], in [0, 1]
        total = weights.new_zeros(num, heads).index_add_(0, segment, weights)  # >= 1 where a segment has keys
        out = q.new_zeros(q.shape, dtype=dtype)
        for start in range(0, entries, chunk):  # loop over chunks of entries, not entries
            rows = slice(start, start + chunk)
            out.index_add_(0, segment[rows], weights[rows].unsqueeze(-1) * v[rows].to(dtype))
        own_weights = None
        if own_logits is not None:
            own_weights = torch.exp(own_logits - peak)
            total += own_weights
            out += own_weights.unsqueeze(-1) * own_v.to(dtype)
        has_key = total > 0
        inverse = 1.0 / torch.where(has_key, total, 1.0)
        out *= inverse.unsqueeze(-1)
        probs = weights.mul_(inverse.index_select(0, segment))
        own_probs = None if own_weights is None else own_weights * inverse
        ctx.save_for_backward(q, k, v, segment, probs, own_probs, own_k, own_v, out)
        ctx.scale, ctx.chunk = scale, chunk
        has_key = has_key[:, 0]
        ctx.mark_non_differentiable(has_key)
        return out.to(q.dtype), has_key

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor, _: Tensor | None) -> tuple[Tensor | None, ...]:
        q, k, v, segment, probs, own_probs, own_k, own_v, out = ctx.saved_tensors
        need_q, need_k, need_v, _, _, need_own_k, need_own_v, _ = ctx.needs_input_grad
        dtype = probs.dtype
        g = grad.to(dtype)
        centre = (g * out).sum(-1)  # [R, H]: g . out, the probability-weighted mean of g . v over the segment
        dq = torch.zeros_like(q, dtype=dtype) if need_q else None
        dk = torch.empty_like(k, dtype=dtype) if need_k else None
        dv = torch.empty_like(v, dtype=dtype) if need_v else None
        for start in range(0, k.shape[0], ctx.chunk):  # loop over chunks of entries, not entries
            rows = slice(start, start + ctx.chunk)
            seg = segment[rows]
            g_rows, p = g.index_select(0, seg), probs[rows]  # [n, H, Dh], [n, H]
            if dv is not None:
                dv[rows] = p.unsqueeze(-1) * g_rows
            dlogits = p * ((g_rows * v[rows].to(dtype)).sum(-1) - centre.index_select(0, seg))
            dlogits = dlogits.mul_(ctx.scale).unsqueeze(-1)  # [n, H, 1]
            if dk is not None:
                dk[rows] = dlogits * q.index_select(0, seg).to(dtype)
            if dq is not None:
                dq.index_add_(0, seg, dlogits * k[rows].to(dtype))
        d_own_k = d_own_v = None
        if own_probs is not None:
            if need_own_v:
                d_own_v = own_probs.unsqueeze(-1) * g
            dlogits = (own_probs * ((g * own_v.to(dtype)).sum(-1) - centre)).mul_(ctx.scale).unsqueeze(-1)
            if dq is not None:
                dq += dlogits * own_k.to(dtype)
            if need_own_k:
                d_own_k = dlogits * q.to(dtype)
        own = _cast(d_own_k, own_k), _cast(d_own_v, own_v)
        return _cast(dq, q), _cast(dk, k), _cast(dv, v), None, None, *own, None


__all__ = ["neighbour_attention", "segment_attention"]
