"""The architecture of a ViT as one plain-data object: what a model is built from, and what files store."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

# Named sizes adapted to 32x32 inputs with 4x4 patches (64 tokens + CLS).
SIZES: dict[str, dict] = {
    "micro": dict(dim=128, depth=6, heads=4, mlp_ratio=2.0),  # CPU budgets
    "tiny": dict(dim=192, depth=9, heads=3, mlp_ratio=4.0),  # DeiT-Ti width, shallower
    "small": dict(dim=384, depth=7, heads=12, mlp_ratio=1.0),  # the ViT-CIFAR shape
    "base": dict(dim=768, depth=12, heads=12, mlp_ratio=4.0),  # ViT-B/DeiT-B
}


def size_config(name: str) -> dict:
    """Architecture arguments of a named size (see ``SIZES``)."""
    if name not in SIZES:
        raise ValueError(f"unknown size {name!r}; choose one of {sorted(SIZES)}")
    return dict(SIZES[name])


def pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """``32`` -> ``(32, 32)``; ``(h, w)`` or ``[h, w]`` -> ``(h, w)``."""
    if isinstance(x, int):
        return (x, x)
    h, w = x
    return (int(h), int(w))


@dataclass
class ViTConfig:
    """Architecture of a :class:`vit.ViT`; checked when made, so a bad value fails before any tensor exists.

    Args:
        size: named row of ``vit.SIZES`` (micro, tiny, small, base) that supplies dim, depth, heads and
            mlp_ratio when they are not given.
        image_size: input height and width (an int for square images).
        patch_size: side of the square patches; must divide both image sides.
        in_channels: channels of the input images.
        num_classes: size of the classifier head; 0 for no head (the model returns pooled features).
        dim: token width (default: the size's).
        depth: number of encoder blocks (default: the size's).
        heads: attention heads per block; must divide dim (default: the size's).
        mlp_ratio: hidden width of the block MLP as a multiple of dim (default: the size's).
        pool: cls reads the CLS token's final state; mean averages the patch tokens.
        dropout: dropout after the embedding, the MLP layers and the attention projection.
        attn_dropout: dropout on the attention weights.
        drop_path: stochastic-depth rate of the last block, rising linearly from 0 at the first.
        patch_drop: share of patch tokens dropped at random from each training image (PatchDropout): training
            steps cost about that much less; evaluation sees every token.
        qkv_bias: bias in the query/key/value projection.
        norm_eps: epsilon of every LayerNorm (timm's ViTs use 1e-6).
        init: trunc_normal (timm's ViT init) or mimetic (attention that starts out attending to neighbours,
            Trockman and Kolter 2023; only the starting point differs).
        dynamic_img_size: accept any image size divisible by patch_size, resampling the position embeddings
            to each input's patch grid (timm's option of that name).
    """

    size: Literal["micro", "tiny", "small", "base"] = "tiny"
    image_size: int | tuple[int, int] = 32
    patch_size: int = 4
    in_channels: int = 3
    num_classes: int = 10
    dim: int | None = None
    depth: int | None = None
    heads: int | None = None
    mlp_ratio: float | None = None
    pool: Literal["cls", "mean"] = "cls"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    patch_drop: float = 0.0
    qkv_bias: bool = True
    norm_eps: float = 1e-5
    init: Literal["trunc_normal", "mimetic"] = "trunc_normal"
    dynamic_img_size: bool = False

    def __post_init__(self) -> None:
        for name, value in size_config(self.size).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.image_size = pair(self.image_size)
        self._check()

    def _check(self) -> None:
        sizes = dict(patch_size=self.patch_size, in_channels=self.in_channels, dim=self.dim, depth=self.depth,
                     heads=self.heads)
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 = no head), got {self.num_classes}")
        if min(self.image_size) < 1:
            raise ValueError(f"image_size must be positive, got {list(self.image_size)}")
        if not int(self.dim * self.mlp_ratio) >= 1:
            raise ValueError(
                f"mlp_ratio must give the MLP at least one hidden unit, got {self.mlp_ratio} (dim {self.dim})"
            )
        for side in self.image_size:
            if side % self.patch_size:
                raise ValueError(f"image_size {side} is not divisible by patch_size {self.patch_size}")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"unknown pool {self.pool!r}; use 'cls' or 'mean'")
        if self.init not in ("trunc_normal", "mimetic"):
            raise ValueError(f"unknown init {self.init!r}; use 'trunc_normal' or 'mimetic'")
        if self.init == "mimetic" and self.dim % 4:
            raise ValueError(
                f"init='mimetic' needs dim divisible by 4 (2-D sin-cos position embeddings), got {self.dim}"
            )
        probabilities = dict(dropout=self.dropout, attn_dropout=self.attn_dropout, drop_path=self.drop_path,
                             patch_drop=self.patch_drop)
        for name, p in probabilities.items():
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patches per column and per row."""
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    def replace(self, **changes) -> ViTConfig:
        """A copy with ``changes`` applied and checked."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data (lists, not tuples) for checkpoints, JSON and safetensors headers."""
        config = dataclasses.asdict(self)
        config["image_size"] = list(self.image_size)
        return config

    @classmethod
    def from_dict(cls, config: dict) -> ViTConfig:
        """The config a file stored, with a message naming any key this version does not know."""
        unknown = sorted(set(config) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown ViT config keys {unknown}: the file was written by another version of vit")
        return cls(**config)
