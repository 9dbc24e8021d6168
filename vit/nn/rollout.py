"""Attention rollout (Abnar & Zuidema 2020): how much each input token flows into the CLS token's final state."""

from __future__ import annotations

import torch
from torch import Tensor

from vit.nn.vit import ViT


@torch.no_grad()
def attention_rollout(model: ViT, images: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Rollout of the CLS token over all tokens: ``(B, 1 + N)``, each row summing to 1.

    Per block the attention weights are averaged over heads, the identity is added for the residual path
    and the rows are renormalised; the blocks' matrices are then multiplied from first to last. Entry ``0`` is
    the CLS token itself, ``[:, 1:]`` the patches (row-major over ``model.grid_size``, ready for a heat map).

    ``images`` are what ``model`` takes (normalised); ``mask`` as in ``model.attention_maps``.
    """
    maps = model.attention_maps(images, mask=mask).mean(dim=2)  # (depth, B, T, T)
    maps = maps + torch.eye(maps.shape[-1], device=maps.device, dtype=maps.dtype)
    maps = maps / maps.sum(dim=-1, keepdim=True)
    rollout = maps[0]
    for layer in maps[1:]:
        rollout = layer @ rollout  # the later block mixes what the earlier ones already mixed
    return rollout[:, 0]
