"""Weights from timm: a timm ``VisionTransformer`` (or its state dict) as a ``vit.ViT`` giving the same logits.

Only the classic ViT converts: a CLS token, learned position embeddings that include the CLS position, pre-norm
blocks of LayerNorm, multi-head attention and a GELU MLP, a final LayerNorm, then the CLS token (timm
``global_pool='token'``) or the mean of the patch tokens (``global_pool='avg'`` with ``fc_norm=False``) into a
linear head. Anything else raises a ``ValueError`` naming the feature, rather than loading into a model that
computes something different.

The tensors keep their names; only the patch embedding changes layout: timm's ``Conv2d`` weight
``(dim, c, p, p)`` becomes our ``Linear`` weight over ``patchify`` patches flattened as ``(p1 p2 c)``.

timm itself is needed only to pass a model (``pip install 'vit[timm]'``); a state dict converts without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from einops import rearrange
from torch import Tensor, nn

from vit.nn.config import ViTConfig, pair
from vit.nn.vit import ViT

# timm's LayerNorm default; a state dict does not record it.
TIMM_NORM_EPS = 1e-6

# Tensors that only exist in variants this ViT cannot express, and the feature each belongs to.
UNSUPPORTED_TENSORS = {
    "reg_token": "register tokens (reg_tokens > 0)",
    ".ls1.": "LayerScale (init_values)",
    ".ls2.": "LayerScale (init_values)",
    ".q_norm.": "qk-norm (qk_norm=True)",
    ".k_norm.": "qk-norm (qk_norm=True)",
    ".attn.norm.": "a norm on the attention output (scale_attn_norm=True)",
    ".mlp.norm.": "a norm inside the MLP (scale_mlp_norm=True)",
    ".attn.gate.": "gated attention",
    "norm_pre.": "a norm before the blocks (pre_norm=True, as in CLIP)",
    "fc_norm.": "fc_norm (a norm after pooling; the default with global_pool='avg')",
    "attn_pool.": "attention pooling (global_pool='map' or 'prr')",
    "patch_embed.norm.": "a norm in the patch embedding (embed_norm_layer)",
}

# Tensors every supported model has, and the feature their absence means.
REQUIRED_TENSORS = {
    "cls_token": "no class token (class_token=False)",
    "pos_embed": "no learned position embeddings (pos_embed='none')",
    "patch_embed.proj.bias": "no patch-embedding bias (pre_norm=True)",
    "blocks.0.attn.proj.bias": "no attention projection bias (proj_bias=False)",
    "blocks.0.mlp.fc1.weight": "an MLP other than timm's Mlp (e.g. SwiGLU)",
    "norm.weight": "no final norm (final_norm=False, or fc_norm)",
    "norm.bias": "a norm without bias (e.g. RmsNorm; only LayerNorm)",
}


def vit_from_timm(
    source: nn.Module | Mapping[str, Tensor],
    *,
    heads: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    pool: str | None = None,
    norm_eps: float | None = None,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    drop_path: float = 0.0,
) -> ViT:
    """A ``vit.ViT`` holding the weights of a timm ``VisionTransformer``, in eval mode (as every loader); in fp32
    both give the same logits.

    Args:
        source: a ``timm.models.vision_transformer.VisionTransformer``, or its ``state_dict()``.
        heads: attention heads. A state dict does not record them (the fused ``qkv`` weight has the same shape
            for any head count), so they are required with one; a model's are read from it.
        image_size: input size of the state dict's model; by default the square grid its ``pos_embed`` holds.
        pool: for a state dict, ``"cls"`` (timm ``global_pool='token'``, the default) or ``"mean"`` (timm
            ``global_pool='avg', fc_norm=False``); a state dict cannot tell the two apart.
        norm_eps: LayerNorm epsilon of a state dict's model; by default timm's ``1e-6``.
        dropout, attn_dropout, drop_path: training regularisation of the new model (timm's is not copied).

    Everything else (width, depth, patch size, channels, classes, MLP ratio, qkv bias) comes from tensor shapes.
    A state dict cannot show its activation or a dynamic image size: it must come from a model with exact GELU.
    Read the model at another image size afterwards with ``ViT.resize_pos_embed``.
    """
    if isinstance(source, nn.Module):
        given = dict(heads=heads, image_size=image_size, pool=pool, norm_eps=norm_eps)
        passed = sorted(name for name, value in given.items() if value is not None)
        if passed:
            raise ValueError(f"{', '.join(passed)} are read from the timm model; pass them only with a state dict")
        state = source.state_dict()
        _check_tensors(state)
        heads, image_size, pool, norm_eps = _check_timm_model(source)
    elif isinstance(source, Mapping):
        state = dict(source)
        _check_tensors(state)
        if heads is None:
            raise ValueError("heads is required with a state dict: tensor shapes do not record the head count")
    else:
        raise TypeError(f"expected a timm VisionTransformer or its state dict, got {type(source).__name__}")
    config = _config_from_shapes(state, heads=heads, image_size=image_size)
    config.update(
        pool=pool or "cls", norm_eps=TIMM_NORM_EPS if norm_eps is None else norm_eps,
        dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path,
    )
    pos_embed = state["pos_embed"]
    model = ViT(ViTConfig(**config)).to(dtype=pos_embed.dtype, device=pos_embed.device)  # as the source keeps them
    model.load_state_dict(convert_state_dict(state))
    model.data_info = _data_info(source)
    return model.eval()  # as every loader: ready to predict


def _data_info(source) -> dict | None:
    """The normalisation (and class names, where timm has them) a timm model was trained with, from its
    ``pretrained_cfg``; a state dict does not record it."""
    cfg = getattr(source, "pretrained_cfg", None) or {}
    if "mean" not in cfg or "std" not in cfg:
        return None
    names = cfg.get("label_names")
    return {"classes": list(names) if names else None, "mean": list(cfg["mean"]), "std": list(cfg["std"])}


def convert_state_dict(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A timm ViT state dict -> ours: the same names, the patch embedding as a Linear over ``(p1 p2 c)`` patches."""
    out = dict(state)
    out["patch_embed.proj.weight"] = rearrange(state["patch_embed.proj.weight"], "d c p1 p2 -> d (p1 p2 c)")
    return out


def _check_tensors(state: dict[str, Tensor]) -> None:
    """Refuse the state dict of a variant, naming the feature its tensors (or their absence) reveal."""
    for name in state:
        for marker, feature in UNSUPPORTED_TENSORS.items():
            if marker in f".{name}":
                raise ValueError(f"unsupported timm ViT feature: {feature} (tensor {name!r})")
    for name, feature in REQUIRED_TENSORS.items():
        if name not in state:
            raise ValueError(f"unsupported timm ViT feature: {feature} (no tensor {name!r})")
    hidden, fc2_in = state["blocks.0.mlp.fc1.weight"].shape[0], state["blocks.0.mlp.fc2.weight"].shape[1]
    if hidden != fc2_in:
        raise ValueError(f"unsupported timm ViT feature: a gated MLP (fc1 gives {hidden} features, fc2 takes {fc2_in})")


def _config_from_shapes(state: dict[str, Tensor], *, heads: int, image_size: int | tuple[int, int] | None) -> dict:
    """ViT constructor arguments read from the shapes of a checked state dict."""
    dim, in_channels, patch_h, patch_w = state["patch_embed.proj.weight"].shape
    if patch_h != patch_w:
        raise ValueError(f"unsupported timm ViT feature: non-square patches {patch_h}x{patch_w}")
    qkv_rows = state["blocks.0.attn.qkv.weight"].shape[0]
    if qkv_rows != 3 * dim:
        raise ValueError(
            f"unsupported timm ViT feature: attention width {qkv_rows // 3} != embed_dim {dim} (attn_head_dim)"
        )
    hidden = state["blocks.0.mlp.fc1.weight"].shape[0]
    mlp_ratio = hidden / dim
    if int(dim * mlp_ratio) != hidden:
        raise ValueError(f"MLP width {hidden} is not int(dim * mlp_ratio) for any float mlp_ratio at dim {dim}")

    positions = state["pos_embed"].shape[1]
    if image_size is None:
        side = math.isqrt(positions - 1)
        if side * side != positions - 1:
            raise ValueError(
                f"pos_embed holds {positions} positions, not 1 + a square grid: pass image_size (a model without "
                "position embeddings for the class token, no_embed_class=True, is unsupported)"
            )
        image_size = side * patch_h
    grid = [side // patch_h for side in pair(image_size)]
    if positions == grid[0] * grid[1]:
        raise ValueError(
            "unsupported timm ViT feature: no position embedding for the class token (no_embed_class=True)"
        )
    if positions != 1 + grid[0] * grid[1]:
        raise ValueError(
            f"pos_embed holds {positions} positions, but image_size {image_size} needs 1 + {grid[0]}x{grid[1]}"
        )

    depth = sum(1 for name in state if name.startswith("blocks.") and name.endswith(".norm1.weight"))
    return dict(
        image_size=image_size, patch_size=patch_h, in_channels=in_channels, dim=dim, depth=depth, heads=heads,
        mlp_ratio=mlp_ratio, num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
    )


def _check_timm_model(model: nn.Module) -> tuple[int, tuple[int, int], str, float]:
    """Refuse what a state dict cannot show; return the model's ``(heads, image_size, pool, norm_eps)``."""
    from timm.layers import Attention, Mlp, PatchEmbed
    from timm.layers.activations import GELU
    from timm.models.vision_transformer import Block, VisionTransformer

    def refuse(feature: str) -> None:
        raise ValueError(f"unsupported timm ViT feature: {feature}")

    if type(model) is not VisionTransformer:
        refuse(f"model class {type(model).__name__} (only timm.models.vision_transformer.VisionTransformer)")
    if model.global_pool == "token":
        pool = "cls"
    elif (
        model.global_pool == "avg"
        and isinstance(model.fc_norm, nn.Identity)
        and not getattr(model, "pool_include_prefix", False)
    ):
        pool = "mean"  # final norm, then the mean of the patch tokens: exactly our pool="mean"
    else:
        refuse(f"global_pool={model.global_pool!r} with these fc_norm/pool_include_prefix; "
               "supported: 'token', or 'avg' with fc_norm=False")
    if model.dynamic_img_size or model.patch_embed.dynamic_img_pad:
        refuse("dynamic image size (dynamic_img_size/dynamic_img_pad); convert, then call ViT.resize_pos_embed")
    if model.no_embed_class:
        refuse("no position embedding for the class token (no_embed_class=True)")
    if model.num_reg_tokens:
        refuse(f"register tokens (reg_tokens={model.num_reg_tokens})")

    embed = model.patch_embed
    if type(embed) is not PatchEmbed or embed.proj.kernel_size != embed.proj.stride or embed.proj.padding != (0, 0):
        refuse(f"patch embedding {type(embed).__name__} other than non-overlapping square patches")
    norms = [model.norm]
    for block in model.blocks:
        if type(block) is not Block or type(block.attn) is not Attention or type(block.mlp) is not Mlp:
            refuse(f"block {type(block).__name__} with {type(block.attn).__name__}/{type(block.mlp).__name__}")
        act = block.mlp.act
        if not (type(act) is GELU or (type(act) is nn.GELU and act.approximate == "none")):
            refuse(f"activation {act!r} (only exact GELU)")
        norms += [block.norm1, block.norm2]
    for norm in norms:
        if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine:
            refuse(f"norm layer {norm!r} (only affine LayerNorm)")
    eps = {norm.eps for norm in norms}
    if len(eps) > 1:
        refuse(f"LayerNorms with different eps {sorted(eps)}")
    heads = {block.attn.num_heads for block in model.blocks}
    if len(heads) > 1:
        refuse(f"blocks with different head counts {sorted(heads)}")
    return heads.pop(), tuple(embed.img_size), pool, eps.pop()
