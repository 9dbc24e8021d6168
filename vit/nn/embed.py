"""Patch tokens and position embeddings: images -> ``(B, N, dim)`` tokens, and the positions they are given."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vit.nn.config import pair


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """``(B, C, H, W)`` images -> ``(B, N, p*p*C)`` patches, row-major over the patch grid, each ``(p1 p2 c)``."""
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size)


def unpatchify(patches: Tensor, patch_size: int, image_size: int | tuple[int, int]) -> Tensor:
    """The exact inverse of :func:`patchify`: ``(B, N, p*p*C)`` -> ``(B, C, H, W)``."""
    height, width = pair(image_size)
    return rearrange(
        patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", h=height // patch_size, p1=patch_size, p2=patch_size
    )


class PatchEmbed(nn.Module):
    """Linear projection of flattened patches: ``proj(patchify(x))``."""

    def __init__(self, patch_size: int, in_channels: int, dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(patchify(images, self.patch_size))  # (B, N, dim)


def sincos_pos_embed(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """2-D sin-cos position embeddings ``(h*w, dim)``, row-major: a quarter of the channels each for
    ``sin(x)``, ``cos(x)``, ``sin(y)``, ``cos(y)`` at geometric frequencies. Nearby patches get similar vectors."""
    h, w = grid_size
    omega = temperature ** -(torch.arange(dim // 4) / max(dim // 4 - 1, 1))  # (dim/4,) frequencies
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    x = x.flatten()[:, None] * omega  # (h*w, dim/4)
    y = y.flatten()[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def resample_pos_embed(pos_embed: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> Tensor:
    """``(1, 1 + h*w, dim)`` position embeddings of an ``old_grid`` -> those of ``new_grid`` (bicubic).

    The CLS position is kept as is; antialiasing applies when the grid shrinks.
    """
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if pos_embed.shape[1] != 1 + old_grid[0] * old_grid[1]:
        raise ValueError(f"pos_embed of shape {tuple(pos_embed.shape)} does not hold 1 + {old_grid} positions")
    if old_grid == new_grid:
        return pos_embed
    cls_pos, grid = pos_embed[:, :1], pos_embed[:, 1:]
    grid = rearrange(grid, "1 (h w) d -> 1 d h w", h=old_grid[0])
    downsampling = new_grid[0] < old_grid[0] or new_grid[1] < old_grid[1]
    # half precision in float32: antialiased bicubic has no such CPU kernel (the cast back stays differentiable)
    half = grid.dtype in (torch.float16, torch.bfloat16)
    grid = F.interpolate(grid.float() if half else grid, size=new_grid, mode="bicubic", align_corners=False,
                         antialias=downsampling)
    return torch.cat([cls_pos, rearrange(grid.to(pos_embed.dtype), "1 d h w -> 1 (h w) d")], dim=1)
