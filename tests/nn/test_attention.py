import math

import pytest
import torch
from torch import nn

from gridtnp.nn.attention import (
    CrossAttentionBlock,
    MultiHeadAttention,
    SelfAttentionBlock,
    masked_mean,
)
from gridtnp.nn.mlp import NarrowLinear, mlp


def reference_attention(mha: MultiHeadAttention, q, kv, mask):
    """Loop over batch items and heads with an explicit softmax (independent of SDPA)."""
    b, nq, _ = q.shape
    out = torch.zeros(b, nq, mha.heads * mha.head_dim)
    Q = mha.to_q(q)
    K, V = mha.to_kv(kv).chunk(2, -1)
    for i in range(b):
        for h in range(mha.heads):
            s = slice(h * mha.head_dim, (h + 1) * mha.head_dim)
            logits = Q[i, :, s] @ K[i, :, s].T / math.sqrt(mha.head_dim)
            logits = logits.masked_fill(~mask[i][None, :], float("-inf"))
            out[i, :, s] = torch.nan_to_num(torch.softmax(logits, -1)) @ V[i, :, s]
    out = mha.out(out)
    return out * mask.any(-1)[:, None, None]


def test_attention_matches_reference_with_padding():
    mha = MultiHeadAttention(dim=32, heads=4, head_dim=8)
    q, kv = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = torch.rand(3, 7) > 0.4
    mask[0] = False  # a task with no valid key
    mask[1, 0] = True
    torch.testing.assert_close(mha(q, kv, mask), reference_attention(mha, q, kv, mask), atol=1e-5, rtol=1e-5)


def test_empty_context_gives_zero_attention_and_finite_gradients():
    block = CrossAttentionBlock(dim=16, heads=2, head_dim=8, mlp_dim=16)
    zq, zkv = torch.randn(2, 4, 16, requires_grad=True), torch.randn(2, 6, 16, requires_grad=True)
    out = block(zq, zkv, torch.zeros(2, 6, dtype=torch.bool))
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert torch.isfinite(zq.grad).all() and torch.isfinite(zkv.grad).all()
    assert zkv.grad.abs().max() == 0  # no valid key: the keys cannot influence the output


def test_self_attention_is_permutation_equivariant_and_ignores_padding():
    block = SelfAttentionBlock(dim=16, heads=2, head_dim=8, mlp_dim=16)
    z = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out = block(z, mask)
    perm = torch.tensor([3, 1, 0, 2, 5, 4])
    torch.testing.assert_close(block(z[:, perm], mask[:, perm]), out[:, perm])
    z2 = z.clone()
    z2[0, 4:] = 1e3  # junk in padded slots
    torch.testing.assert_close(block(z2, mask)[0, :4], out[0, :4])


def test_masked_mean():
    z = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    torch.testing.assert_close(masked_mean(z, mask), torch.tensor([[2.0, 3.0], [0.0, 0.0]]))


def test_explicit_attention_equals_sdpa_in_float64_with_gradients():
    """The CPU path for few keys (``explicit_attention``) gives SDPA's values and gradients, with every mask kind."""
    import torch.nn.functional as F

    from gridtnp.nn.attention import FEW_KEYS, explicit_attention, few_keys

    torch.manual_seed(0)
    q = torch.randn(6, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(6, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(6, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    boolean = torch.rand(6, 1, 16, 16) > 0.5
    boolean[..., 0] = True  # every query has a key, as attention_mask guarantees
    for mask in (None, boolean, torch.randn(6, 4, 16, 16, dtype=torch.float64)):
        outs = []
        for fn in (explicit_attention, lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3])):
            q.grad = k.grad = v.grad = None
            out = fn(q, k, v, mask)
            out.square().sum().backward()
            outs.append([out.detach(), q.grad, k.grad, v.grad])
        for a, b in zip(*outs, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert few_keys(q, k, 0.0) and not few_keys(q, k, 0.1) and not few_keys(q[:, :, :1], k, 0.0)
    assert not few_keys(q, torch.zeros(6, 4, FEW_KEYS + 1, 8), 0.0)


def test_narrow_linear_is_linear_with_the_same_parameters_and_gradients():
    net = mlp(3, 16, 8, layers=2)
    assert isinstance(net[0], NarrowLinear) and type(net[2]) is nn.Linear  # only a narrow input layer
    assert type(mlp(32, 16, 8)[0]) is nn.Linear
    torch.manual_seed(0)
    narrow = NarrowLinear(3, 16).double()
    plain = nn.Linear(3, 16).double()
    plain.load_state_dict(narrow.state_dict())  # same parameter names and shapes
    x = torch.randn(2, 50, 3, dtype=torch.float64, requires_grad=True)
    grads = []
    for layer in (narrow, plain):
        x.grad = None
        out = layer(x)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape))
        grads.append([out.detach(), x.grad.clone(), layer.weight.grad, layer.bias.grad])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def _randomise_norms(module: nn.Module) -> None:
    """Give every LayerNorm a non-trivial affine, so folding it is tested (the default is g = 1, b = 0)."""
    for norm in module.modules():
        if isinstance(norm, nn.LayerNorm):
            nn.init.normal_(norm.weight, 1.0, 0.3)
            nn.init.normal_(norm.bias, 0.0, 0.3)


def test_standardised_cross_attention_equals_the_block_with_gradients():
    """``forward_standardised`` (norm_kv folded into the weights, no key bias, the value shift added once per query)
    is ``forward``: values and gradients of the inputs and of every parameter, with padding, a task without keys,
    a key/value bias, SDPA's path and the explicit one for few keys, and under dropout."""
    from gridtnp.nn.attention import standardise

    for num_keys, dropout in ((40, 0.0), (8, 0.0), (40, 0.3)):  # 40 > FEW_KEYS: SDPA; 8: explicit_attention
        torch.manual_seed(0)
        block = CrossAttentionBlock(dim=16, heads=2, head_dim=8, mlp_dim=16, dropout=dropout).double()
        block.attn.to_kv.bias = nn.Parameter(torch.randn(32, dtype=torch.float64))
        _randomise_norms(block)
        zq = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
        zkv = torch.randn(3, num_keys, 16, dtype=torch.float64, requires_grad=True)
        mask = torch.rand(3, num_keys) > 0.3
        mask[2] = False  # a task without keys: zero update
        results = []
        for standardised in (False, True):
            block.zero_grad()
            zq.grad = zkv.grad = None
            torch.manual_seed(1)  # the same dropout draws
            if standardised:
                out = block.forward_standardised(zq, standardise(zkv, block.norm_kv), mask)
            else:
                out = block(zq, zkv, mask)
            out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape))
            results.append([out.detach(), zq.grad, zkv.grad] + [p.grad for p in block.parameters()])
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_perceiver_layers_are_cross_then_self_attention_blocks():
    """The perceiver's shared context normalisation changes no layer: each state is MHSA(MHCA(U; Zc))."""
    from gridtnp.nn.processors.sets import PerceiverProcessor
    from gridtnp.nn.tokens import Latent

    torch.manual_seed(0)
    proc = PerceiverProcessor(dim=16, num_tokens=4, layers=3, heads=2, head_dim=8, mlp_dim=16).double()
    _randomise_norms(proc)
    zc = torch.randn(2, 50, 16, dtype=torch.float64)
    mask = torch.rand(2, 50) > 0.2
    states = proc(Latent(zc, mask=mask))
    u = proc.initial(2, zc.dtype)
    for cross, self_attn, state in zip(proc.to_pseudo, proc.mix, states, strict=True):
        u = self_attn(cross(u, zc, mask))
        torch.testing.assert_close(state.tokens, u, atol=1e-12, rtol=1e-10)


def test_standardised_cross_attention_refuses_te_attention():
    from gridtnp.nn.te_attention import TEAttention

    block = CrossAttentionBlock(dim=16, mlp_dim=16, attention=TEAttention(dim=16, dim_x=2, heads=2, head_dim=8))
    with pytest.raises(ValueError, match="plain attention"):
        block.forward_standardised(torch.randn(1, 3, 16), torch.randn(1, 4, 16))
