"""Scaled dot-product attention: one primitive, and the multi-head module built on it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``softmax(q @ k^T * scale) @ v``, the one attention primitive of the package.

    Args:
        q: queries ``(..., Nq, d)``; plain 2-D tensors work too.
        k: keys ``(..., Nk, d)``.
        v: values ``(..., Nk, dv)``.
        mask: boolean, True where a query may attend to a key; broadcastable to ``(..., Nq, Nk)``.
        scale: multiplier of the logits; ``None`` means ``1 / sqrt(d)``, a float is used as given
            (``scale=1.0`` is unscaled dot-product attention).
        dropout_p: dropout on the attention weights (pass 0 at evaluation).
        need_weights: also return the softmax weights ``(..., Nq, Nk)``.

    Returns:
        The output ``(..., Nq, dv)``, or ``(output, weights)`` when ``need_weights``.

    Without weights this runs PyTorch's fused ``F.scaled_dot_product_attention``; with weights it runs the
    readable reference path below, which gives the same output (``tests/test_attention.py`` proves it).

    A query whose mask row is all False may attend to nothing: its output row and its weights are zeros,
    never NaN (softmax over an empty set is undefined, and zero is what "no contribution" means).
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query width {q.shape[-1]} does not match key width {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{k.shape[-2]} keys but {v.shape[-2]} values: they must pair up")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    nq, nk = q.shape[-2], k.shape[-2]
    if mask is not None and ((mask.dim() >= 1 and mask.shape[-1] not in (1, nk))
                             or (mask.dim() >= 2 and mask.shape[-2] not in (1, nq))):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not fit {nq} queries and {nk} keys: it must "
                         f"broadcast to (..., {nq}, {nk})")
    if mask is not None and mask.dim() < 2:  # a key mask (Nk,) or one flag: spell out (Nq, Nk), as SDPA needs
        mask = mask.expand(nq, nk)

    # A fully masked row would give softmax(-inf, ..., -inf) = NaN: let it see every key, then zero it.
    empty = None
    if mask is not None:
        empty = ~mask.any(dim=-1, keepdim=True)  # (..., Nq, 1)
        mask = mask | empty

    if need_weights:
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        scores = (q @ k.transpose(-2, -1)) * scale  # (..., Nq, Nk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        if empty is not None:
            weights = weights.masked_fill(empty, 0.0)
        out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v
        return out, weights

    squeeze = q.dim() == 2  # the fused kernels want a batch dimension
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        mask = mask.unsqueeze(0) if mask is not None and mask.dim() > 0 else mask
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if squeeze:
        out = out.squeeze(0)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-attention when ``context`` is None, cross-attention otherwise.

    Queries come from ``x`` ``(B, N, dim)``; keys and values from ``context`` ``(B, M, context_dim)`` (any
    length ``M``), or from ``x`` itself. Without ``context_dim`` one fused ``qkv`` projection serves both
    cases (a context must then be ``dim`` wide); with it, queries and keys/values get their own projections
    ``q`` and ``kv`` because their input widths differ.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        dim_head: int | None = None,
        context_dim: int | None = None,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"heads must be positive, got {heads}")
        if dim_head is None:
            if dim % heads:
                raise ValueError(f"dim {dim} is not divisible by heads {heads}; pick heads that divide it")
            dim_head = dim // heads
        self.heads = heads
        self.dim_head = dim_head
        self.dim = dim
        self.context_dim = context_dim
        inner = heads * dim_head
        if context_dim is None:
            self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias)
        else:
            self.q = nn.Linear(dim, inner, bias=qkv_bias)
            self.kv = nn.Linear(context_dim, 2 * inner, bias=qkv_bias)
        self.attn_dropout = attn_dropout
        self.proj = nn.Linear(inner, dim)
        self.proj_drop = nn.Dropout(proj_dropout)

    def _split_heads(self, t: Tensor, parts: int) -> tuple[Tensor, ...]:
        """``(B, N, parts * heads * d)`` -> ``parts`` views ``(B, heads, N, d)``, no copies.

        ``unbind`` on the ``parts`` axis (rather than selecting from a permuted tensor) keeps the backward to one
        copy: SDPA's CPU kernel returns its input gradients in the ``(B, N, heads, d)`` layout these views have,
        so the gradients stack straight into the projection's ``(B, N, parts * heads * d)`` layout. Selecting
        ``qkv[i]`` instead would zero-fill and add into a full ``(3, B, heads, N, d)`` buffer once per part.
        """
        return tuple(part.transpose(1, 2) for part in t.unflatten(-1, (parts, self.heads, self.dim_head)).unbind(2))

    def _projections(self) -> tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]:
        """``(W_q, b_q), (W_kv, b_kv)``: views of the fused ``qkv`` projection, or the ``q`` and ``kv`` ones."""
        if self.context_dim is not None:
            return (self.q.weight, self.q.bias), (self.kv.weight, self.kv.bias)
        inner = self.heads * self.dim_head
        w_q, w_kv = self.qkv.weight.split([inner, 2 * inner])
        b_q, b_kv = self.qkv.bias.split([inner, 2 * inner]) if self.qkv.bias is not None else (None, None)
        return (w_q, b_q), (w_kv, b_kv)

    def _check_context(self, context: Tensor | None) -> None:
        if context is None:
            if self.context_dim is not None:
                raise ValueError(
                    f"this module was built for cross-attention (context_dim={self.context_dim}); pass context"
                )
            return
        if self.context_dim is None and context.shape[-1] != self.dim:
            raise ValueError(
                f"context width {context.shape[-1]} != dim {self.dim}; "
                "build the module with context_dim to attend to a context of another width"
            )
        if self.context_dim is not None and context.shape[-1] != self.context_dim:
            raise ValueError(f"context width {context.shape[-1]} != context_dim {self.context_dim}")

    def _absorbs(self, queries: int, keys: int, width: int) -> bool:
        """Whether folding the key/value projections into the queries costs fewer multiply-adds (per head).

        Projecting keys and values costs ``2 M C d`` and attending ``2 N M d``; folded, the queries and outputs
        cost ``2 N d C`` and attending over ``C``-wide context vectors ``2 N M C``. So: few queries, long context
        (the CLS query of a classifier's last block: 1 query, 65 keys).
        """
        d = self.dim_head
        return queries * width * (d + keys) < keys * d * (width + queries)

    def _attend_absorbed(
        self, x: Tensor, context: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The same attention with ``W_k`` and ``W_v`` moved off the context (the "absorbed" form of MLA).

        ``q . (W_k c + b_k) = (W_k^T q) . c + q . b_k``, and ``q . b_k`` is the same for every key, so softmax
        ignores it: each head's query is mapped into the context's space and attends to the raw context. The
        weights sum to 1, so ``sum_j p_j (W_v c_j + b_v) = W_v (sum_j p_j c_j) + b_v``: the weighted context is
        projected once per query. (Dropout on the weights breaks that sum, so it never takes this path.)
        """
        heads, d = self.heads, self.dim_head
        b, n, m = x.shape[0], x.shape[-2], context.shape[-2]
        (w_q, b_q), (w_kv, b_kv) = self._projections()
        w_k, w_v = w_kv.unflatten(0, (2, heads, d)).unbind(0)  # (heads, d, C) each
        q = F.linear(x, w_q, b_q).unflatten(-1, (heads, d))  # (B, N, heads, d)
        q = torch.einsum("bnhd,hdc->bhnc", q, w_k).flatten(1, 2)  # (B, heads * N, C): queries in context space
        if mask is not None:
            mask = torch.broadcast_to(mask, (b, heads, n, m)).flatten(1, 2)  # (B, heads * N, M)
        out = attend(q, context, context, mask=mask, scale=d**-0.5, need_weights=need_weights)
        out, weights = out if need_weights else (out, None)
        v = torch.einsum("bhnc,hdc->bhnd", out.unflatten(1, (heads, n)), w_v)  # (B, heads, N, d)
        if b_kv is not None:
            b_v = b_kv.unflatten(0, (2, heads, 1, d))[1]  # (heads, 1, d)
            # a fully masked query attends to nothing: its weights sum to 0, and so must its share of b_v
            v = v + b_v if mask is None else v + mask.any(-1).unflatten(1, (heads, n)).unsqueeze(-1) * b_v
        return v, None if weights is None else weights.unflatten(1, (heads, n))

    def _project(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if self.context_dim is None and context is None:
            return self._split_heads(self.qkv(x), 3)
        (w_q, b_q), (w_kv, b_kv) = self._projections()
        (q,) = self._split_heads(F.linear(x, w_q, b_q), 1)
        k, v = self._split_heads(F.linear(context, w_kv, b_kv), 2)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` ``(B, N, dim)`` to ``context`` (or ``x``); ``mask`` broadcasts to ``(B, heads, N, M)``.

        Returns ``(B, N, dim)``, or ``(output, weights)`` with weights ``(B, heads, N, M)``. A few queries
        against a long context (``N`` well below ``dim_head``) take the cheaper absorbed form, same result.
        """
        for name, t in (("x", x), ("context", context)):
            if t is not None and t.dim() != 3:
                raise ValueError(f"{name} must be batched, (B, tokens, width); got shape {tuple(t.shape)}")
        if x.shape[-1] != self.dim:
            raise ValueError(f"x width {x.shape[-1]} != dim {self.dim}")
        self._check_context(context)
        dropout_p = self.attn_dropout if self.training else 0.0
        if context is not None and dropout_p == 0 and self._absorbs(x.shape[-2], context.shape[-2], context.shape[-1]):
            out, weights = self._attend_absorbed(x, context, mask, need_weights)
        else:
            q, k, v = self._project(x, context)  # (B, heads, N|M, d)
            out = attend(q, k, v, mask=mask, dropout_p=dropout_p, need_weights=need_weights)
            out, weights = out if need_weights else (out, None)
        # (B, heads, N, d) -> (B, N, heads * d): free for the fused path, whose output is laid out (B, N, heads, d)
        out = self.proj_drop(self.proj(out.transpose(1, 2).flatten(2)))
        return (out, weights) if need_weights else out
