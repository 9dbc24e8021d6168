"""The Vision Transformer: patch tokens, a CLS token, position embeddings, pre-norm encoder blocks, a head."""

from __future__ import annotations

import math
import os
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vit.attention import MultiHeadAttention
from vit.checkpoint import load_checkpoint_file, vit_weights

# Named sizes adapted to 32x32 inputs with 4x4 patches (64 tokens + CLS).
SIZES: dict[str, dict] = {
    "micro": dict(dim=128, depth=6, heads=4, mlp_ratio=2.0),  # ~0.8M params: CPU budgets
    "tiny": dict(dim=192, depth=9, heads=3, mlp_ratio=4.0),  # ~4.0M: DeiT-Ti width, shallower
    "small": dict(dim=384, depth=7, heads=12, mlp_ratio=1.0),  # ~6.3M: the ViT-CIFAR shape
    "base": dict(dim=768, depth=12, heads=12, mlp_ratio=4.0),  # ~85M: ViT-B/DeiT-B
}


def size_config(name: str) -> dict:
    """Architecture arguments of a named size (see ``SIZES``)."""
    if name not in SIZES:
        raise ValueError(f"unknown size {name!r}; choose one of {sorted(SIZES)}")
    return dict(SIZES[name])


def _pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    h, w = x
    return (int(h), int(w))


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """``(B, C, H, W)`` images -> ``(B, N, p*p*C)`` patches, row-major over the patch grid, each ``(p1 p2 c)``."""
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size)


def unpatchify(patches: Tensor, patch_size: int, image_size: int | tuple[int, int]) -> Tensor:
    """The exact inverse of :func:`patchify`: ``(B, N, p*p*C)`` -> ``(B, C, H, W)``."""
    height, width = _pair(image_size)
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


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's whole residual branch with probability ``p`` while training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class Mlp(nn.Module):
    """Two linear layers with GELU between: the position-wise feed-forward of a block."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm encoder block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(dim, heads, qkv_bias=qkv_bias, attn_dropout=attn_dropout, proj_dropout=dropout)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)
        self.drop_path = DropPath(drop_path)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, queries: int | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``(B, N, dim) -> (B, N, dim)``; with ``need_weights`` also the attention weights ``(B, heads, N, N)``.

        ``queries=q`` computes the outputs of the first ``q`` tokens only, ``(B, q, dim)``: they still attend to
        all ``N`` tokens, but the query and output projections and the MLP run on ``q`` rows instead of ``N``,
        and for few queries the key/value projections fold into the query side instead of running on all ``N``
        (see ``MultiHeadAttention``). The last block of a CLS-pooled classifier needs only token 0, so this
        saves nearly all of that block.
        """
        h = self.norm1(x)
        if queries is None:
            attn = self.attn(h, mask=mask, need_weights=need_weights)
        else:
            if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1:
                mask = mask[..., :queries, :]  # the rows of the kept queries
            x = x[:, :queries]
            attn = self.attn(h[:, :queries], context=h, mask=mask, need_weights=need_weights)
        attn, weights = attn if need_weights else (attn, None)
        x = x + self.drop_path(attn)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return (x, weights) if need_weights else x


class ViT(nn.Module):
    """Vision Transformer classifier (Dosovitskiy et al. 2021) with a learned CLS token.

    Args:
        image_size: input height and width (an int for square images).
        patch_size: side of the square patches; must divide both image sides.
        in_channels: channels of the input images.
        num_classes: size of the head; 0 makes the head an identity and ``forward`` return pooled features.
        dim: token width.
        depth: number of encoder blocks.
        heads: attention heads per block; must divide ``dim``.
        mlp_ratio: hidden width of the block MLP, as a multiple of ``dim``.
        pool: ``"cls"`` reads the CLS token's final state, ``"mean"`` averages the patch tokens.
        dropout: dropout after the embedding, the MLP layers and the attention projection.
        attn_dropout: dropout on the attention weights.
        drop_path: stochastic-depth rate of the last block, linearly increasing from 0 at the first (as in timm, a
            single block is the first and gets 0).
        patch_drop: share of patch tokens dropped at random from each training image after the position
            embedding (PatchDropout, Liu et al. 2022): training costs about that much less, evaluation sees all.
        qkv_bias: bias in the query/key/value projection.
        norm_eps: epsilon of every LayerNorm (timm's ViTs use 1e-6).
        init: ``"trunc_normal"`` (timm's ViT init) or ``"mimetic"`` (Trockman & Kolter 2023): each head's
            ``W_q^T W_k`` starts near ``+I`` and each block's ``W_proj W_v`` near ``-I``, plus 2-D sin-cos
            position embeddings, so that from step 0 a token attends to its neighbours, as in trained ViTs.
            Only the starting point differs: the architecture and what it can learn are the same.
        dynamic_img_size: accept images of any size divisible by ``patch_size`` (as timm's option of that name):
            the position embeddings are resampled to the input's patch grid on every forward, differentiably,
            so a model can also be trained at a lower resolution than ``image_size``.
    """

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        num_classes: int = 10,
        dim: int = 192,
        depth: int = 9,
        heads: int = 3,
        mlp_ratio: float = 4.0,
        pool: Literal["cls", "mean"] = "cls",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        patch_drop: float = 0.0,
        qkv_bias: bool = True,
        norm_eps: float = 1e-5,
        init: Literal["trunc_normal", "mimetic"] = "trunc_normal",
        dynamic_img_size: bool = False,
    ) -> None:
        super().__init__()
        image_size = _pair(image_size)
        sizes = dict(patch_size=patch_size, in_channels=in_channels, dim=dim, depth=depth, heads=heads)
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 = no head), got {num_classes}")
        if min(image_size) < 1:
            raise ValueError(f"image_size must be positive, got {list(image_size)}")
        if not int(dim * mlp_ratio) >= 1:
            raise ValueError(f"mlp_ratio must give the MLP at least one hidden unit, got {mlp_ratio} (dim {dim})")
        if any(side % patch_size for side in image_size):
            side = next(side for side in image_size if side % patch_size)
            raise ValueError(f"image_size {side} is not divisible by patch_size {patch_size}")
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        if pool not in ("cls", "mean"):
            raise ValueError(f"unknown pool {pool!r}; use 'cls' or 'mean'")
        if init not in ("trunc_normal", "mimetic"):
            raise ValueError(f"unknown init {init!r}; use 'trunc_normal' or 'mimetic'")
        if init == "mimetic" and dim % 4:
            raise ValueError(f"init='mimetic' needs dim divisible by 4 (2-D sin-cos position embeddings), got {dim}")
        probabilities = dict(dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path, patch_drop=patch_drop)
        for name, p in probabilities.items():
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")

        # The constructor arguments, plain data: what checkpoints and exports store to rebuild the model.
        self.config = dict(
            image_size=list(image_size), patch_size=patch_size, in_channels=in_channels, num_classes=num_classes,
            dim=dim, depth=depth, heads=heads, mlp_ratio=mlp_ratio, pool=pool, dropout=dropout,
            attn_dropout=attn_dropout, drop_path=drop_path, patch_drop=patch_drop, qkv_bias=qkv_bias,
            norm_eps=norm_eps, init=init, dynamic_img_size=dynamic_img_size,
        )
        self.image_size = image_size
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.dim = dim
        self.pool = pool
        self.patch_drop = patch_drop
        self.init = init
        self.dynamic_img_size = dynamic_img_size
        self.grid_size = (image_size[0] // patch_size, image_size[1] // patch_size)
        num_patches = self.grid_size[0] * self.grid_size[1]

        self.patch_embed = PatchEmbed(patch_size, in_channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + num_patches, dim))
        self.pos_drop = nn.Dropout(dropout)
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio, qkv_bias, dropout, attn_dropout, rate, norm_eps) for rate in rates
        )
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated-normal(0.02) weights and embeddings, zero biases, unit norms: the one place of init.

        With ``init="mimetic"`` the attention weights and position embeddings are then set as described in the
        class docstring.
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
        if self.init == "mimetic":
            self.pos_embed[0, 1:] = sincos_pos_embed(self.grid_size, self.dim)
            for block in self.blocks:
                mimetic_attention_init_(block.attn)

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, *, weights: str = "model", image_size: int | tuple[int, int] | None = None
    ) -> "ViT":
        """The plain ``ViT`` of a training checkpoint written by ``vit.ViTClassifier``, weights loaded.

        ``weights="ema"`` takes the exponential moving average of the weights, when the run kept one.
        ``image_size`` adapts the model to another input size (see :meth:`resize_pos_embed`). The file is read
        with ``torch.load(weights_only=True)``: loading it cannot run code.

        The model comes back in eval mode, ready to predict: a run's config may hold training-only randomness
        (``patch_drop`` drops tokens, ``dropout``) that would otherwise make every forward differ. Call
        ``.train()`` to fine-tune it.
        """
        config, state = vit_weights(load_checkpoint_file(path), path, weights)
        model = cls(**config)
        model.load_state_dict(state)
        if image_size is not None:
            model.resize_pos_embed(image_size)
        return model.eval()

    @classmethod
    def from_timm(cls, model_or_state_dict: nn.Module | dict[str, Tensor], **kwargs) -> "ViT":
        """A ``ViT`` with the weights of a timm ``VisionTransformer`` (or its state dict), same logits.

        Keyword arguments go to :func:`vit.timm_interop.vit_from_timm` (``heads`` is required for a state dict).
        Architectures this class cannot express exactly raise a ``ValueError`` naming the feature.
        """
        from vit.timm_interop import vit_from_timm  # timm stays an optional extra

        return vit_from_timm(model_or_state_dict, **kwargs)

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike) -> "ViT":
        """Load a model written by :meth:`save_safetensors`: config and weights, no pickle involved; in eval mode,
        as :meth:`from_checkpoint`."""
        from vit.export import load_safetensors

        return load_safetensors(path)

    def save_safetensors(self, path: str | os.PathLike) -> None:
        """Write the weights as safetensors with ``config`` in its metadata, and ``config`` as JSON beside it."""
        from vit.export import save_safetensors

        save_safetensors(self, path)

    def no_weight_decay(self) -> set[str]:
        """Names of parameters exempt from weight decay: biases, norms, the CLS token and position embeddings."""
        return {name for name, p in self.named_parameters() if p.ndim <= 1 or name in ("cls_token", "pos_embed")}

    def check_images(self, images: Tensor) -> None:
        """Raise a ``TypeError``/``ValueError`` naming what is wrong with an input batch."""
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
        if self.dynamic_img_size:
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
        # NaN pixels would silently turn every logit into NaN. The check reads a value back (a GPU sync), so the
        # training hot path leaves it to the loss check, and traced, compiled and exported graphs leave it out:
        # they must not hold a data-dependent branch.
        capturing = (torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
                     or torch.onnx.is_in_onnx_export())
        if not self.training and not capturing and not images.isfinite().all():
            bad = (~images.isfinite()).sum().item()
            raise ValueError(
                f"images contain {bad} NaN or infinite values (shape {tuple(images.shape)}); check the data"
            )

    def forward_features(self, images: Tensor, mask: Tensor | None = None, cls_only: bool = False) -> Tensor:
        """Images ``(B, C, H, W)`` -> normalised tokens ``(B, 1 + N, dim)``; token 0 is the CLS token.

        ``mask`` (boolean, True = may attend) broadcasts to ``(B, heads, 1 + N, 1 + N)``. ``cls_only`` returns
        just the CLS token, ``(B, 1, dim)``, with the same value, at less cost: in the last block only the CLS
        row goes through the projections, the MLP and the final norm, and the other tokens' keys and values are
        never projected (the key/value weights fold into the CLS query); ``forward`` uses it for ``pool="cls"``.
        """
        x = self._embed(images, mask)
        for block in self.blocks[:-1]:
            x = block(x, mask=mask)
        x = self.blocks[-1](x, mask=mask, queries=1 if cls_only else None)
        return self.norm(x)

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool tokens ``(B, 1 + N, dim)`` (CLS or mean of patches) and apply the head, unless ``pre_logits``."""
        x = tokens[:, 0] if self.pool == "cls" else tokens[:, 1:].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Images ``(B, C, H, W)`` -> logits ``(B, num_classes)``; pooled features ``(B, dim)`` if ``num_classes=0``."""
        return self.forward_head(self.forward_features(images, mask=mask, cls_only=self.pool == "cls"))

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
        x = self._embed(images, mask)
        states = {}
        for i, block in enumerate(self.blocks[: max(indices) + 1]):
            x = block(x, mask=mask)
            states[i] = self.norm(x) if norm else x
        return [states[i] for i in indices]

    def resize_pos_embed(self, image_size: int | tuple[int, int]) -> None:
        """Adapt the model, in place, to inputs of ``image_size``: the patch-grid position embeddings are
        resampled bicubically (the CLS position is kept); ``image_size``, ``grid_size`` and ``config`` follow.

        ``pos_embed`` becomes a new Parameter: build optimizers after calling this.
        """
        image_size = _pair(image_size)
        if min(image_size) < 1:
            raise ValueError(f"image_size must be positive, got {list(image_size)}")
        if any(side % self.patch_size for side in image_size):
            raise ValueError(f"image_size {image_size} is not divisible by patch_size {self.patch_size}")
        grid_size = (image_size[0] // self.patch_size, image_size[1] // self.patch_size)
        self.pos_embed = nn.Parameter(resample_pos_embed(self.pos_embed.detach(), self.grid_size, grid_size),
                                      requires_grad=self.pos_embed.requires_grad)
        self.image_size, self.grid_size = image_size, grid_size
        self.config["image_size"] = list(image_size)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        # Weights trained at another image size load by resampling their position embeddings; the old grid
        # is taken to be square, as only the number of positions is known.
        key = prefix + "pos_embed"
        pos_embed = state_dict.get(key)
        if pos_embed is not None and pos_embed.ndim == 3 and pos_embed.shape != self.pos_embed.shape:
            side = math.isqrt(pos_embed.shape[1] - 1)
            if side * side == pos_embed.shape[1] - 1 and pos_embed.shape[2] == self.dim:
                state_dict[key] = resample_pos_embed(pos_embed, (side, side), self.grid_size)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def attention_maps(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """Softmax attention weights of every block: ``(depth, B, heads, 1 + N, 1 + N)``.

        Always those of the model as it predicts, in eval mode (every token, no dropout), whatever mode it is in:
        the mode is restored afterwards.
        """
        training = self.training
        self.eval()
        try:
            x = self._embed(images, mask)
            maps = []
            for block in self.blocks:
                x, weights = block(x, mask=mask, need_weights=True)
                maps.append(weights)
        finally:
            self.train(training)
        return torch.stack(maps)

    def _embed(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
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


def sincos_pos_embed(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """2-D sin-cos position embeddings ``(h*w, dim)``, row-major: a quarter of the channels each for
    ``sin(x)``, ``cos(x)``, ``sin(y)``, ``cos(y)`` at geometric frequencies. Nearby patches get similar vectors."""
    h, w = grid_size
    omega = temperature ** -(torch.arange(dim // 4) / max(dim // 4 - 1, 1))  # (dim/4,) frequencies
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    x = x.flatten()[:, None] * omega  # (h*w, dim/4)
    y = y.flatten()[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def _near_identity_factors(n: int, alpha: float, beta: float) -> tuple[Tensor, Tensor]:
    """``left, right`` (n, n) with ``left @ right = alpha * Z + beta * I``, Z uniform with variance 1/n.

    The factors split the singular values evenly (``U sqrt(S)``, ``sqrt(S) V^T``), so neither side is larger.
    """
    bound = math.sqrt(3.0 / n)
    target = alpha * torch.empty(n, n).uniform_(-bound, bound) + beta * torch.eye(n)
    u, s, vh = torch.linalg.svd(target)
    return u * s.sqrt(), s.sqrt()[:, None] * vh


def mimetic_attention_init_(attn: MultiHeadAttention, qk: tuple[float, float] = (0.7, 0.7),
                            vo: tuple[float, float] = (0.4, 0.4)) -> None:
    """Mimetic initialisation (Trockman & Kolter 2023) of a fused-``qkv`` self-attention module, in place.

    Each head's ``W_q^T W_k`` becomes the best rank-``dim_head`` approximation of ``qk[0] * Z + qk[1] * I``,
    and ``W_proj W_v`` becomes ``vo[0] * Z - vo[1] * I``: the query-key and value-output products that
    trained ViTs are seen to have.
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
