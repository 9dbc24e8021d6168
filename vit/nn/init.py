"""Mimetic initialisation (Trockman & Kolter 2023): attention that starts out looking like trained attention."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vit.nn.attention import MultiHeadAttention


def _near_identity_factors(n: int, alpha: float, beta: float) -> tuple[Tensor, Tensor]:
    """``left, right`` (n, n) with ``left @ right = alpha * Z + beta * I``, Z uniform with variance 1/n.

    The factors split the singular values evenly (``U sqrt(S)``, ``sqrt(S) V^T``), so neither side is larger.
    """
    bound = math.sqrt(3.0 / n)
    target = alpha * torch.empty(n, n).uniform_(-bound, bound) + beta * torch.eye(n)
    u, s, vh = torch.linalg.svd(target)
    return u * s.sqrt(), s.sqrt()[:, None] * vh


@torch.no_grad()
def mimetic_attention_init_(attn: MultiHeadAttention, qk: tuple[float, float] = (0.7, 0.7),
                            vo: tuple[float, float] = (0.4, 0.4)) -> None:
    """Mimetic initialisation of a fused-``qkv`` self-attention module, in place.

    Each head's ``W_q^T W_k`` becomes the best rank-``dim_head`` approximation of ``qk[0] * Z + qk[1] * I``,
    and ``W_proj W_v`` becomes ``vo[0] * Z - vo[1] * I``: the query-key and value-output products that
    trained ViTs are seen to have, so that from step 0 a token attends to its neighbours.
    """
    dim, heads, d = attn.dim, attn.heads, attn.dim_head
    inner = heads * d
    if attn.context_dim is not None or inner > dim:
        raise ValueError("mimetic init needs a fused qkv projection no wider than dim")
    weight = attn.qkv.weight  # (3 * inner, dim): the q rows of every head, then the k rows, then the v rows
    for h in range(heads):
        left, right = _near_identity_factors(dim, *qk)
        weight[h * d:(h + 1) * d] = left[:, :d].T  # W_q of head h, (d, dim)
        weight[inner + h * d:inner + (h + 1) * d] = right[:d]  # W_k of head h, (d, dim)
    left, right = _near_identity_factors(dim, vo[0], -vo[1])
    weight[2 * inner:] = right[:inner]  # W_v, (inner, dim)
    attn.proj.weight.copy_(left[:, :inner])  # W_proj, (dim, inner)
