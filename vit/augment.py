"""Batched augmentation of uint8 image tensors on the training device: no per-image PIL work."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Zero-pad each side by ``padding`` and take one random crop of the original size per image."""
    if padding == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=images.device)
    rows = top + torch.arange(h, device=images.device).view(1, h, 1)  # (B, H, 1)
    cols = left + torch.arange(w, device=images.device).view(1, 1, w)  # (B, 1, W)
    batch = torch.arange(b, device=images.device).view(b, 1, 1)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (B, C, H, W)


def random_flip(images: Tensor) -> Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = torch.rand(images.shape[0], 1, 1, 1, device=images.device) < 0.5
    return torch.where(flip, images.flip(-1), images)


class BatchAugment(nn.Module):
    """Random crop with zero padding, then a horizontal flip, on a whole ``(B, C, H, W)`` uint8 batch."""

    def __init__(self, crop_padding: int = 4, flip: bool = True) -> None:
        super().__init__()
        if crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {crop_padding}")
        self.crop_padding = crop_padding
        self.flip = flip

    def forward(self, images: Tensor) -> Tensor:
        images = random_crop(images, self.crop_padding)
        return random_flip(images) if self.flip else images
