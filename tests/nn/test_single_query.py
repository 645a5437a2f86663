"""neighbour_attention and segment_attention against SDPA over padded keys, values and gradients in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gridtnp.nn import single_query
from gridtnp.nn.single_query import neighbour_attention, segment_attention


def sdpa_one_query(q, k, v, mask, bias=None):
    """SDPA reference: q [N, H, Dh], k, v [N, K, H, Dh], mask [N, K] -> [N, H, Dh] (zero where no key)."""
    has_key = mask.any(-1)
    attn = torch.zeros(*mask.shape[:1], q.shape[1], 1, mask.shape[1], dtype=q.dtype)  # [N, H, 1, K]
    if bias is not None:
        attn = attn + bias.permute(0, 2, 1).unsqueeze(2)
    attn = attn.masked_fill(~(mask | ~has_key[:, None])[:, None, None], float("-inf"))
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn)
    return out.squeeze(2) * has_key[:, None, None]


def grads_of(fn, tensors):
    """Output and the gradients of a fixed random projection of it."""
    for t in tensors:
        t.grad = None
    out = fn()
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return [out.detach()] + [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("chunk_elements", [None, 1, 2 * 5 * 12])  # one chunk; one query each; 2 and a partial one
def test_neighbour_attention_equals_sdpa(monkeypatch: pytest.MonkeyPatch, chunk_elements: int | None) -> None:
    if chunk_elements is not None:
        monkeypatch.setattr(single_query, "CPU_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    n, kk, h, dh, rows = 13, 5, 3, 4, 6
    f64 = {"dtype": torch.float64, "requires_grad": True}
    q = torch.randn(n, h, dh, **f64)
    keys, values = torch.randn(rows, h * dh, **f64), torch.randn(rows, h * dh, **f64)
    bias = torch.randn(n, kk, h, **f64)
    key_offset, value_offset = torch.randn(n, kk, h, dh, **f64), torch.randn(n, kk, h, dh, **f64)
    index = torch.randint(0, rows - 1, (n, kk))  # rows repeat (their gradients add up); the last is never read
    mask = torch.rand(n, kk) > 0.4
    mask[0] = False  # a query with no key: zero output, zero gradients to its keys
    mask[1] = True

    def gathered(table, offset):
        t = table[index].view(n, kk, h, dh)
        return t if offset is None else t + offset

    cases = ((None, None, None), (bias, None, None), (bias, key_offset, value_offset), (None, key_offset, None))
    for b, ko, vo in cases:
        tensors = [q, keys, values] + [t for t in (b, ko, vo) if t is not None]
        new = grads_of(lambda b=b, ko=ko, vo=vo: neighbour_attention(q, keys, values, index, mask, b, ko, vo), tensors)
        ref = grads_of(
            lambda b=b, ko=ko, vo=vo: sdpa_one_query(q, gathered(keys, ko), gathered(values, vo), mask, b), tensors
        )
        for a, r in zip(new, ref, strict=True):
            torch.testing.assert_close(a, r, atol=1e-12, rtol=1e-12)
        assert new[0][0].abs().max() == 0  # the query without keys
    # Rows read only by masked keys or by the query without keys get no gradient.
    read = torch.zeros(rows, dtype=torch.bool)
    read[index[mask]] = True
    assert not read.all()
    assert (keys.grad[~read] == 0).all() and (values.grad[~read] == 0).all()


def test_neighbour_attention_shape_errors() -> None:
    q, table, index = torch.randn(4, 2, 3), torch.randn(5, 6), torch.zeros(4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"keys and values \[R, H Dh\] = \[R, 6\]"):
        neighbour_attention(q, table[:, :4], table[:, :4], index)
    with pytest.raises(ValueError, match=r"index \[N, K\] with N = 4"):
        neighbour_attention(q, table, table, index[:3])
    with pytest.raises(ValueError, match=r"key_offset must be \[N, K, H, Dh\]"):
        neighbour_attention(q, table, table, index, key_offset=torch.zeros(4, 2, 6))


@pytest.mark.parametrize("chunk_elements", [None, 8, 7 * 8])  # one chunk; one entry each; 7 and a partial one
def test_segment_attention_equals_padded_sdpa(monkeypatch: pytest.MonkeyPatch, chunk_elements: int | None) -> None:
    if chunk_elements is not None:
        monkeypatch.setattr(single_query, "CPU_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(1)
    r, e, h, dh = 7, 30, 2, 4
    q = torch.randn(r, h, dh, dtype=torch.float64, requires_grad=True)
    k = torch.randn(e, h, dh, dtype=torch.float64, requires_grad=True)
    v = torch.randn(e, h, dh, dtype=torch.float64, requires_grad=True)
    own_k = torch.randn(r, h, dh, dtype=torch.float64, requires_grad=True)
    own_v = torch.randn(r, h, dh, dtype=torch.float64, requires_grad=True)
    segment = torch.randint(0, r - 1, (e,))  # the last segment has no entries
    keep = torch.rand(e) > 0.3
    for own in (None, (own_k, own_v)):

        def padded(own=own):
            # Each segment's kept entries (and its own key first) in a [R, S, H, Dh] buffer with a mask.
            rows = [torch.nonzero((segment == i) & keep).flatten() for i in range(r)]
            size = max(len(x) for x in rows) + (own is not None)
            kb = torch.zeros(r, size, h, dh, dtype=torch.float64)
            vb, mb = torch.zeros_like(kb), torch.zeros(r, size, dtype=torch.bool)
            for i, idx in enumerate(rows):  # loop over segments (a test reference)
                first = int(own is not None)
                if own is not None:
                    kb[i, 0], vb[i, 0], mb[i, 0] = own[0][i], own[1][i], True
                kb[i, first : first + len(idx)], vb[i, first : first + len(idx)] = k[idx], v[idx]
                mb[i, first : first + len(idx)] = True
            return sdpa_one_query(q, kb, vb, mb)

        tensors = [q, k, v] + ([] if own is None else list(own))
        _, has_key = segment_attention(q, k, v, segment, keep, own)
        assert has_key.tolist() == ([True] * r if own else [bool(((segment == i) & keep).any()) for i in range(r)])
        new = grads_of(lambda own=own: segment_attention(q, k, v, segment, keep, own)[0], tensors)
        ref = grads_of(padded, tensors)
        for a, b in zip(new, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
