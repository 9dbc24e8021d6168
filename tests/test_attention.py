import math

import pytest
import torch
import torch.nn.functional as F

import vit
from vit.nn import attention


def reference(q, k, v, scale, mask=None):
    """The textbook formula, written out independently of vit.attend."""
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("use_mask", [False, True])
def test_fused_equals_reference_path(use_mask):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 7, 16), torch.randn(2, 3, 9, 16), torch.randn(2, 3, 9, 5)
    mask = torch.rand(2, 1, 7, 9) > 0.4 if use_mask else None
    if mask is not None:
        mask[..., 0] = True  # no fully masked rows here; those are tested below
    fused = vit.attend(q, k, v, mask=mask)
    ref, weights = vit.attend(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused, reference(q, k, v, 1 / 4, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 7))
    if mask is not None:
        assert (weights[~mask.expand_as(weights)] == 0).all()


def test_plain_2d_tensors_like_the_textbook():
    q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 3)
    out = vit.attend(q, k, v)
    assert out.shape == (4, 3)
    torch.testing.assert_close(out, torch.softmax(q @ k.T / math.sqrt(8), dim=-1) @ v)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    torch.testing.assert_close(vit.attend(q, k, v, mask=mask), vit.attend(q, k, v, mask=mask, need_weights=True)[0])
    keys = torch.tensor([True, False, True, True, False, True])  # a key mask: the same for every query
    expected = vit.attend(q, k, v, mask=keys.expand(4, 6))
    torch.testing.assert_close(vit.attend(q, k, v, mask=keys), expected)
    torch.testing.assert_close(vit.attend(q, k, v, mask=keys, need_weights=True)[0], expected)
    torch.testing.assert_close(vit.attend(q[None], k[None], v[None], mask=keys)[0], expected)


@pytest.mark.parametrize("scale", [1.0, 0.1, 3.0])
def test_scale_is_used_as_given(scale):
    q, k, v = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    expected = torch.softmax(scale * q @ k.T, dim=-1) @ v
    torch.testing.assert_close(vit.attend(q, k, v, scale=scale), expected)
    out, weights = vit.attend(q, k, v, scale=scale, need_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, torch.softmax(scale * q @ k.T, dim=-1))


def test_fully_masked_row_returns_zeros_not_nan():
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 2)
    mask = torch.ones(1, 3, 5, dtype=torch.bool)
    mask[0, 1] = False
    for need_weights in (False, True):
        out = vit.attend(q, k, v, mask=mask, need_weights=need_weights)
        out, weights = out if need_weights else (out, None)
        assert torch.isfinite(out).all()
        assert (out[0, 1] == 0).all()
        torch.testing.assert_close(out[0, [0, 2]], reference(q, k, v, 0.5)[0, [0, 2]])
        if weights is not None:
            assert (weights[0, 1] == 0).all()


def test_bad_shapes_and_masks_are_named():
    with pytest.raises(ValueError, match="query width 4 does not match key width 5"):
        vit.attend(torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5))
    with pytest.raises(TypeError, match="mask must be boolean"):
        vit.attend(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), mask=torch.ones(3, 3))


def test_self_and_cross_attention_shapes():
    torch.manual_seed(0)
    x, context = torch.randn(2, 7, 32), torch.randn(2, 11, 48)
    self_attn = vit.MultiHeadAttention(32, 4)
    assert self_attn(x).shape == (2, 7, 32)
    out, weights = self_attn(x, need_weights=True)
    assert weights.shape == (2, 4, 7, 7)
    torch.testing.assert_close(out, self_attn(x), rtol=1e-5, atol=1e-6)

    cross = vit.MultiHeadAttention(32, 4, dim_head=8, context_dim=48)
    out, weights = cross(x, context, need_weights=True)
    assert out.shape == (2, 7, 32) and weights.shape == (2, 4, 7, 11)
    torch.testing.assert_close(out, cross(x, context), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="pass context"):
        cross(x)


def test_same_width_context_reuses_the_fused_projection():
    torch.manual_seed(0)
    attn = vit.MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    # cross-attending to yourself is self-attention
    torch.testing.assert_close(attn(x, context=x), attn(x), rtol=1e-5, atol=1e-6)
    assert attn(x, context=torch.randn(2, 9, 16)).shape == (2, 5, 16)
    with pytest.raises(ValueError, match="context_dim"):
        attn(x, context=torch.randn(2, 9, 8))


def test_heads_must_divide_dim():
    with pytest.raises(ValueError, match="dim 10 is not divisible by heads 3"):
        vit.MultiHeadAttention(10, 3)


def project(attn, x, context):
    """Queries from ``x``, keys and values from ``context``, each ``(B, heads, tokens, dim_head)``: the module's
    projections written out from its public layers (``qkv`` holds W_q, W_k, W_v stacked in that order)."""
    inner = attn.heads * attn.dim_head
    if attn.context_dim is None:
        (w_q, w_kv), (b_q, b_kv) = attn.qkv.weight.split([inner, 2 * inner]), attn.qkv.bias.split([inner, 2 * inner])
    else:
        (w_q, w_kv), (b_q, b_kv) = (attn.q.weight, attn.kv.weight), (attn.q.bias, attn.kv.bias)
    q = F.linear(x, w_q, b_q).unflatten(-1, (attn.heads, attn.dim_head)).transpose(1, 2)
    kv = F.linear(context, w_kv, b_kv).unflatten(-1, (2, attn.heads, attn.dim_head))  # (B, M, 2, heads, d)
    k, v = kv.permute(2, 0, 3, 1, 4)  # each (B, heads, M, d)
    return q, k, v


def key_widths(monkeypatch):
    """The width of the keys each call of ``attend`` from the attention module gets: ``dim_head`` for projected
    keys, the context's own width when the projections are folded into the queries."""
    widths = []
    attend = attention.attend

    def spy(q, k, v, **kwargs):
        widths.append(k.shape[-1])
        return attend(q, k, v, **kwargs)

    monkeypatch.setattr(attention, "attend", spy)
    return widths


@pytest.mark.parametrize("context_dim", [None, 24])
def test_few_queries_take_the_absorbed_path_with_the_same_result(context_dim, monkeypatch):
    """One query against a long context folds W_k and W_v into the query side; outputs, weights, gradients and
    fully masked rows must match projecting the keys and values as usual."""
    torch.manual_seed(0)
    attn = vit.MultiHeadAttention(32, 4, dim_head=16, context_dim=context_dim)
    x, context = torch.randn(3, 1, 32), torch.randn(3, 40, context_dim or 32)
    widths = key_widths(monkeypatch)
    attn(x, context)
    attn(torch.randn(3, 40, 32), context)
    assert widths == [context.shape[-1], 16]  # 1 query attends over the raw context, 40 over projected keys
    mask = torch.rand(3, 4, 1, 40) > 0.5
    mask[0, 1] = False  # a query that may attend to nothing: output zeros, no bias
    for m in (None, mask, mask[0, 0, 0]):  # none, per batch and head, one row broadcast everywhere
        out, weights = attn(x, context, mask=m, need_weights=True)
        grads = torch.autograd.grad(out.square().sum(), list(attn.parameters()))

        q, k, v = project(attn, x, context)  # the projected form, written out
        ref, ref_weights = vit.attend(q, k, v, mask=m, need_weights=True)
        ref = attn.proj(ref.transpose(1, 2).flatten(2))
        ref_grads = torch.autograd.grad(ref.square().sum(), list(attn.parameters()))

        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(attn(x, context, mask=m), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
        # the key bias has no effect (softmax ignores a shift shared by all keys): zero gradient both ways
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
