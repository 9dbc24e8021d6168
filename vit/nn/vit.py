"""The Vision Transformer: patch tokens, a CLS token, position embeddings, pre-norm encoder blocks, a head."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vit.nn.block import Block
from vit.nn.config import ViTConfig, pair
from vit.nn.embed import PatchEmbed, resample_pos_embed, sincos_pos_embed
from vit.nn.init import mimetic_attention_init_


class ViT(nn.Module):
    """Vision Transformer classifier (Dosovitskiy et al. 2021) with a learned CLS token.

    Built from a :class:`vit.ViTConfig`, or from its fields as keyword arguments:
    ``ViT(ViTConfig(size="micro"))``, ``ViT(dim=192, depth=6, heads=3)``, ``ViT(config, num_classes=100)``.
    ``model.config`` is the architecture, plain data: what checkpoints and exports store to rebuild the model.
    ``model.data_info`` says what the weights were trained on, when known: ``{"classes": [names] or None, "mean":
    [r, g, b], "std": [r, g, b]}`` (the normalisation of 0-1 pixel values). The loaders set it from the file; a new
    model has none. It is plain data that travels with the weights, never used by the network itself.

    Loading and saving weights (``ViT.from_checkpoint``, ``from_safetensors``, ``from_timm``,
    ``save_safetensors``) live in :mod:`vit.weights`, which builds on this class.
    """

    def __init__(self, config: ViTConfig | None = None, **kwargs) -> None:
        super().__init__()
        config = config.replace(**kwargs) if config is not None else ViTConfig(**kwargs)
        self.config = config
        self.data_info: dict | None = None
        # the share of patch tokens training drops now: config.patch_drop, unless a schedule changes it
        self.patch_drop = config.patch_drop

        self.patch_embed = PatchEmbed(config.patch_size, config.in_channels, config.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + math.prod(config.grid_size), config.dim))
        self.pos_drop = nn.Dropout(config.dropout)
        rates = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(
            Block(config.dim, config.heads, config.mlp_ratio, config.qkv_bias, config.dropout, config.attn_dropout,
                  rate, config.norm_eps)
            for rate in rates
        )
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes) if config.num_classes > 0 else nn.Identity()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated-normal(0.02) weights and embeddings, zero biases, unit norms: the one place of init.

        With ``init="mimetic"`` the attention weights and 2-D sin-cos position embeddings are then set so that
        from step 0 a token attends to its neighbours, as in trained ViTs (:mod:`vit.nn.init`).
        """
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.config.init == "mimetic":
            self.pos_embed[0, 1:] = sincos_pos_embed(self.grid_size, self.config.dim)
            for block in self.blocks:
                mimetic_attention_init_(block.attn)

    def embed(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Images ``(B, C, H, W)`` -> tokens ``(B, 1 + N, dim)``: patches, the CLS token first, positions added.

        While training with ``patch_drop``, each image keeps a random subset of its patch tokens (and the CLS).
        """
        self.check_images(images)
        if mask is not None and self.training and self.patch_drop > 0:
            raise ValueError(
                "a mask cannot be combined with patch_drop while training: it is sized for all 1 + N tokens, and "
                "each image keeps another subset; call .eval() or build the model with patch_drop=0"
            )
        x = self.patch_embed(images)  # (B, N, dim)
        grid = (images.shape[-2] // self.patch_size, images.shape[-1] // self.patch_size)
        # another grid gets here only with dynamic_img_size (check_images): resample, differentiably
        pos_embed = resample_pos_embed(self.pos_embed, self.grid_size, grid)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + pos_embed  # (B, 1 + N, dim)
        if self.training and self.patch_drop > 0:
            b, n, d = x.shape
            keep = max(1, round((n - 1) * (1 - self.patch_drop)))
            index = torch.rand(b, n - 1, device=x.device).argsort(dim=1)[:, :keep] + 1  # (B, keep), CLS is 0
            x = torch.cat([x[:, :1], x.gather(1, index.unsqueeze(-1).expand(-1, -1, d))], dim=1)  # (B, 1 + keep, dim)
        return self.pos_drop(x)

    def forward_features(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Images ``(B, C, H, W)`` -> normalised tokens ``(B, 1 + N, dim)``; token 0 is the CLS token.

        ``mask`` (boolean, True = may attend) broadcasts to ``(B, heads, 1 + N, 1 + N)``.
        """
        x = self.embed(images, mask)
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.norm(x)

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool tokens ``(B, 1 + N, dim)`` (CLS or mean of patches) and apply the head, unless ``pre_logits``."""
        x = tokens[:, 0] if self.config.pool == "cls" else tokens[:, 1:].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Images ``(B, C, H, W)`` -> logits ``(B, num_classes)``; pooled features ``(B, dim)`` if ``num_classes=0``."""
        if self.config.pool == "cls":  # only the CLS token reaches the head
            return self.forward_head(self.forward_cls(images, mask))
        return self.forward_head(self.forward_features(images, mask))

    def forward_cls(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """``forward_features(images)[:, :1]``, the normalised CLS token ``(B, 1, dim)``, at less cost: the last
        block computes the CLS row alone (:meth:`vit.nn.block.Block.forward_cls`)."""
        x = self.embed(images, mask)
        for block in self.blocks[:-1]:
            x = block(x, mask=mask)
        return self.norm(self.blocks[-1].forward_cls(x, mask=mask))

    # ---- the architecture, read from the config ----------------------------------------------------------

    @property
    def image_size(self) -> tuple[int, int]:
        return self.config.image_size

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.config.grid_size

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    @property
    def in_channels(self) -> int:
        return self.config.in_channels

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    # ---- helpers ------------------------------------------------------------------------------------------

    def check_images(self, images: Tensor) -> None:
        """Raise a ``TypeError``/``ValueError`` naming what is wrong with an input batch's type, shape or dtype.

        Only metadata is read, never pixel values: a check of the values (NaN) would wait for the device on
        every forward. The tools check the values of the files they read.
        """
        if not isinstance(images, Tensor):
            raise TypeError(f"expected a torch.Tensor of images, got {type(images).__name__}")
        if not images.is_floating_point():
            raise TypeError(
                f"expected floating-point images, got {images.dtype}; convert e.g. with images.float() / 255"
            )
        if images.dim() != 4:
            raise ValueError(f"expected images of shape (B, C, H, W), got shape {tuple(images.shape)}")
        weights = self.pos_embed.dtype
        if images.dtype != weights and not torch.is_autocast_enabled(images.device.type):
            raise TypeError(
                f"images are {images.dtype} but the model's weights are {weights}; convert with images.to({weights})"
                " or run under torch.autocast"
            )
        if images.shape[1] != self.in_channels:
            raise ValueError(
                f"expected {self.in_channels} channels, got {images.shape[1]} (shape {tuple(images.shape)})"
            )
        if self.config.dynamic_img_size:
            if any(side < self.patch_size or side % self.patch_size for side in images.shape[-2:]):
                raise ValueError(
                    f"images of size {images.shape[-2]}x{images.shape[-1]} are not divisible into "
                    f"{self.patch_size}x{self.patch_size} patches"
                )
        elif tuple(images.shape[-2:]) != self.image_size:
            raise ValueError(
                f"expected images of size {self.image_size[0]}x{self.image_size[1]}, got "
                f"{images.shape[-2]}x{images.shape[-1]}; resize them or call model.resize_pos_embed"
            )

    def reset_classifier(self, num_classes: int) -> None:
        """A new head for ``num_classes`` classes (0: none, the model returns pooled features), initialised as in
        ``init_weights``; every other weight is kept. For fine-tuning on another label set (timm's name)."""
        config = self.config.replace(num_classes=num_classes)
        ref = self.pos_embed
        if num_classes > 0:
            self.head = nn.Linear(config.dim, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)
        else:
            self.head = nn.Identity()
        self.config = config
        if self.data_info is not None:  # the old class names no longer describe the head
            self.data_info = {**self.data_info, "classes": None}

    def no_weight_decay(self) -> set[str]:
        """Names of parameters exempt from weight decay: biases, norms, the CLS token and position embeddings."""
        return {name for name, p in self.named_parameters() if p.ndim <= 1 or name in ("cls_token", "pos_embed")}

    def forward_intermediates(
        self, images: Tensor, layers: int | list[int] = 4, *, norm: bool = False, mask: Tensor | None = None
    ) -> list[Tensor]:
        """Token states ``(B, 1 + N, dim)`` after chosen blocks: the last ``layers`` ones, or those indices.

        Indices count from 0 and may be negative (``-1`` is the last block). ``norm`` applies the final norm to
        each, as ``forward_features`` does to the last. Blocks after the deepest chosen one are not run.
        """
        depth = len(self.blocks)
        if isinstance(layers, int):
            if not 1 <= layers <= depth:
                raise ValueError(f"layers={layers}: the model has {depth} blocks, ask for 1 to {depth}")
            indices = list(range(depth - layers, depth))
        else:
            if not layers:
                raise ValueError("layers is an empty list: name at least one block index")
            bad = [i for i in layers if not -depth <= i < depth]
            if bad:
                raise ValueError(f"block indices {bad} out of range for a model with {depth} blocks")
            indices = [i % depth for i in layers]
        x = self.embed(images, mask)
        states = {}
        for i, block in enumerate(self.blocks[: max(indices) + 1]):
            x = block(x, mask=mask)
            states[i] = self.norm(x) if norm else x
        return [states[i] for i in indices]

    @torch.no_grad()
    def attention_maps(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Softmax attention weights of every block: ``(depth, B, heads, 1 + N, 1 + N)``.

        Always those of the model as it predicts, in eval mode (every token, no dropout), whatever mode it is in:
        the mode is restored afterwards.
        """
        training = self.training
        self.eval()
        try:
            x = self.embed(images, mask)
            maps = []
            for block in self.blocks:
                maps.append(block.attn(block.norm1(x), mask=mask, need_weights=True)[1])
                x = block(x, mask=mask)
        finally:
            self.train(training)
        return torch.stack(maps)

    def resize_pos_embed(self, image_size: int | tuple[int, int]) -> None:
        """Adapt the model, in place, to inputs of ``image_size``: the patch-grid position embeddings are
        resampled bicubically (the CLS position is kept), and ``config.image_size`` follows.

        ``pos_embed`` becomes a new Parameter: build optimizers after calling this.
        """
        config = self.config.replace(image_size=pair(image_size))
        self.pos_embed = nn.Parameter(resample_pos_embed(self.pos_embed.detach(), self.grid_size, config.grid_size),
                                      requires_grad=self.pos_embed.requires_grad)
        self.config = config

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        # Weights trained at another image size load by resampling their position embeddings; the old grid
        # is taken to be square, as only the number of positions is known.
        key = prefix + "pos_embed"
        pos_embed = state_dict.get(key)
        if pos_embed is not None and pos_embed.ndim == 3 and pos_embed.shape != self.pos_embed.shape:
            side = math.isqrt(pos_embed.shape[1] - 1)
            if side * side == pos_embed.shape[1] - 1 and pos_embed.shape[2] == self.config.dim:
                state_dict[key] = resample_pos_embed(pos_embed, (side, side), self.grid_size)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
