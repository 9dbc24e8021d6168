"""Pretrained weights for a new task: any file the package reads (or a timm model name), adapted to the task.

:func:`load_pretrained` takes the architecture from the weights and the task from the user: a new head when the
number of classes differs, position embeddings resampled to the new image size, patch-embedding kernels resampled
to a new patch size (FlexiViT's pseudo-inverse resize), and the training regularisation (dropout, drop_path, ...)
of the new run rather than the old one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vit.nn.config import ViTConfig, pair
from vit.nn.embed import resample_pos_embed
from vit.nn.vit import ViT
from vit.weights.checkpoint import CONFIG_KEY, DATA_KEY, load_checkpoint_file, vit_weights
from vit.weights.safetensors import read_safetensors
from vit.weights.timm import vit_from_timm

TIMM_PREFIX = "timm:"

# The architecture comes from the weights. Of its fields, those whose ViTConfig default is None can be told to be a
# user's choice: one that differs from the weights' is an error. The others (size, in_channels, qkv_bias, pool,
# norm_eps, init) are taken from the weights whatever is requested, as their defaults look like choices.
CHECKED = ("dim", "depth", "heads", "mlp_ratio")
# The new run's training regularisation (its defaults when not requested), never the pretraining run's.
REGULARISATION = ("dropout", "attn_dropout", "drop_path", "patch_drop", "dynamic_img_size")

# timm's head counts for its standard widths (ViT-Ti, S, B, L, H), for the hint when a state dict lacks them.
TIMM_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def load_pretrained(source: str | os.PathLike, *, weights: str = "model", **requested) -> ViT:
    """A ``ViT`` holding pretrained weights, adapted to a new task; in eval mode, as every loader (call ``.train()``).

    Args:
        source: where the weights are:

            * a training checkpoint of this package (``.ckpt``, any suffix: it is recognised by its
              ``vit_config``); ``weights="ema"`` takes its weight average;
            * a safetensors export of this package (``ViT.save_safetensors``: ``vit_config`` in the header);
            * a timm ``VisionTransformer`` state dict: ``.pth``/``.bin``/``.pt`` (read with
              ``torch.load(weights_only=True)``, also when wrapped as ``{"model": ...}`` or ``{"state_dict": ...}``)
              or ``.safetensors`` without ``vit_config``. It needs ``heads``: tensor shapes do not record them.
              timm's LayerNorm epsilon (1e-6) and CLS pooling are assumed; for a mean-pooled model convert it
              with ``vit_from_timm(..., pool="mean")`` and save it with ``save_safetensors`` first;
            * ``timm:NAME``: ``timm.create_model(NAME, pretrained=True)``, which needs timm and a network (or its
              cache).
        weights: of a training checkpoint, ``"model"`` or ``"ema"``.
        **requested: ``ViTConfig`` fields the user gave for the new task (``None`` counts as not given):

            * ``num_classes``: a different count gets a fresh head (``ViT.reset_classifier``); 0 a backbone;
            * ``image_size``: a different size resamples the position embeddings (bicubic);
            * ``patch_size``: a different size resamples the patch-embedding kernels as FlexiViT does
              (:func:`resample_patch_kernels`), so that a 16x16-patch model can read 4x4 patches; the patch
              grid, and with it the position embeddings, follow;
            * ``dropout``, ``attn_dropout``, ``drop_path``, ``patch_drop``, ``dynamic_img_size``: the new run's
              (their defaults when not given; the pretraining run's are not kept);
            * ``dim``, ``depth``, ``heads``, ``mlp_ratio``: must equal the weights' when given (a ``ValueError``
              naming both values otherwise); ``heads`` is required for a timm state dict;
            * ``size``, ``in_channels``, ``qkv_bias``, ``pool``, ``norm_eps``, ``init``: ignored, the weights'
              are used.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (naming the file and the value) for
    anything else that does not fit. ``model.data_info`` (normalisation, class names) is the weights' where the
    file records it; class names are dropped with a new head.
    """
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = sorted(set(requested) - fields)
    if unknown:
        raise ValueError(f"unknown ViT config fields {unknown}; known: {sorted(fields)}")
    requested = {name: value for name, value in requested.items() if value is not None}

    name = repr(str(source))
    config, state, data_info = _read(source, name, weights, requested)
    _check_architecture(config, requested, name)

    new = dict(config)
    for field in REGULARISATION:
        new[field] = requested.get(field, getattr(ViTConfig, field))
    new["image_size"] = pair(requested.get("image_size", config["image_size"]))
    new["patch_size"] = requested.get("patch_size", config["patch_size"])
    try:
        target = ViTConfig.from_dict(new)
    except ValueError as err:
        raise ValueError(f"the weights in {name} cannot be adapted to this task: {err}") from None

    old_grid = ViTConfig.from_dict(config).grid_size
    state = dict(state)
    if target.patch_size != config["patch_size"]:
        state["patch_embed.proj.weight"] = _resample_linear_patches(
            state["patch_embed.proj.weight"], config["patch_size"], target.patch_size, config["in_channels"], name)
    if "pos_embed" in state:
        pos_embed = state["pos_embed"]
        if pos_embed.shape[1] != 1 + old_grid[0] * old_grid[1]:
            raise ValueError(f"pos_embed in {name} holds {pos_embed.shape[1]} positions, but its config's "
                             f"{old_grid[0]}x{old_grid[1]} patch grid needs {1 + old_grid[0] * old_grid[1]}")
        state["pos_embed"] = resample_pos_embed(pos_embed.float(), old_grid, target.grid_size)

    model = ViT(target)  # at the weights' num_classes, so that their head loads; replaced below if it changes
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"the weights in {name} do not fit the model their config describes: {err}") from None
    model.data_info = data_info
    num_classes = requested.get("num_classes", config["num_classes"])
    if num_classes != model.num_classes:
        model.reset_classifier(num_classes)
    return model.eval()


def resample_patch_kernels(kernels: Tensor, new_size: int | tuple[int, int]) -> Tensor:
    """Patch-embedding kernels ``(..., p, p)`` resampled to ``new_size``, FlexiViT's way (Beyer et al. 2023).

    Not an interpolation of the kernels: the new kernels ``w'`` solve ``<resize(x), w'> = <x, w>`` for every
    patch ``x`` in the least-squares sense, ``w' = pinv(B^T) w`` with ``B`` the (bicubic, antialiased) resize
    of a patch. Upsampled patches then give exactly the old tokens; smaller patches the closest possible. The same
    computation as timm's ``resample_patch_embed``.
    """
    old = tuple(kernels.shape[-2:])
    new = pair(new_size)
    if old == new:
        return kernels
    basis = torch.eye(old[0] * old[1], dtype=torch.float64).reshape(-1, 1, *old)
    resized = F.interpolate(basis, size=new, mode="bicubic", antialias=True, align_corners=False)
    resize_t = resized.reshape(old[0] * old[1], new[0] * new[1])  # B^T: row i is the resize of basis patch i
    pinv = torch.linalg.pinv(resize_t)  # (new, old)
    flat = kernels.reshape(-1, old[0] * old[1]).to(torch.float64)
    return (flat @ pinv.T).reshape(*kernels.shape[:-2], *new).to(kernels.dtype)


# ---- reading the sources ---------------------------------------------------------------------------------------

def _read(source, name: str, weights: str, requested: dict) -> tuple[dict, dict, dict | None]:
    """``(config dict, state dict in our names, data_info)`` of the weights at ``source``."""
    if isinstance(source, str) and source.startswith(TIMM_PREFIX):
        _only_model_weights(weights, name)
        return _from_model(_create_timm_model(source[len(TIMM_PREFIX):]), name)
    path = Path(source).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"pretrained weights {name} is a folder, not a file: pass the weights file in it")
    if not path.is_file():
        raise FileNotFoundError(f"pretrained weights {name} do not exist (a file, or timm:NAME for a timm model)")
    if path.suffix.lower() == ".safetensors":
        state, metadata = read_safetensors(path)
        _only_model_weights(weights, name)
        if CONFIG_KEY in metadata:
            data_info = json.loads(metadata[DATA_KEY]) if DATA_KEY in metadata else None
            return json.loads(metadata[CONFIG_KEY]), state, data_info
        return _from_timm_state(state, name, requested)
    if path.suffix.lower() == ".ckpt":
        ckpt = load_checkpoint_file(path)  # a training checkpoint: its own, more specific messages
    else:
        ckpt = _torch_load(path, name)
    if isinstance(ckpt, dict) and CONFIG_KEY in ckpt:
        config, state = vit_weights(ckpt, path, weights)
        return config, state, ckpt.get(DATA_KEY)
    _only_model_weights(weights, name)
    return _from_timm_state(_unwrap(ckpt, name), name, requested)


def _create_timm_model(model_name: str):
    try:
        import timm
    except ImportError:
        raise ValueError(f"timm:{model_name} needs timm (pip install 'vit[timm]'), or pass the path of a downloaded "
                         "weights file instead") from None
    try:
        return timm.create_model(model_name, pretrained=True)
    except Exception as err:  # noqa: BLE001 - unknown names, no network, hub errors: all mean "cannot get it here"
        raise ValueError(
            f"could not create timm model {model_name!r} with pretrained weights ({type(err).__name__}: {err}). "
            f"Without internet access, download the weights file of {model_name!r} elsewhere (e.g. its "
            "model.safetensors or pytorch_model.bin on the Hugging Face Hub) and pass its path instead of "
            f"timm:{model_name}, with --model.heads"
        ) from None


def _only_model_weights(weights: str, name: str) -> None:
    if weights != "model":
        raise ValueError(f"weights={weights!r} needs a training checkpoint that kept them; {name} is not one")


def _from_model(model, name: str) -> tuple[dict, dict, dict | None]:
    try:
        ours = vit_from_timm(model)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return ours.config.to_dict(), ours.state_dict(), ours.data_info


def _from_timm_state(state: dict, name: str, requested: dict) -> tuple[dict, dict, dict | None]:
    if "patch_embed.proj.weight" not in state or "blocks.0.attn.qkv.weight" not in state:
        keys = ", ".join(list(state)[:5])
        raise ValueError(
            f"{name} is neither a vit checkpoint or export (no {CONFIG_KEY!r}) nor a timm ViT state dict (no "
            f"'patch_embed.proj.weight' and 'blocks.0.attn.qkv.weight'; its first keys: {keys})"
        )
    if "heads" not in requested:
        dim = state["patch_embed.proj.weight"].shape[0]
        hint = f" (timm's ViTs of width {dim} use {TIMM_HEADS[dim]})" if dim in TIMM_HEADS else ""
        raise ValueError(f"{name} is a timm state dict, whose tensors do not record the number of attention heads: "
                         f"pass --model.heads{hint}")
    try:
        model = vit_from_timm(state, heads=requested["heads"])
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return model.config.to_dict(), model.state_dict(), None


def _torch_load(path: Path, name: str):
    """``torch.load(weights_only=True)``: tensors and plain data only, never code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"refused to load {name}: it is not a PyTorch file of tensors and plain data only (such "
                         "files could run code when unpickled)") from None
    except Exception as err:  # noqa: BLE001 - a foreign or truncated file fails in many ways inside the unpickler
        raise ValueError(f"{name} is not a readable PyTorch file ({type(err).__name__}: {err})") from None


def _unwrap(ckpt, name: str) -> dict:
    """The tensors of a state dict, also when wrapped (``{"model": ...}``, ``{"state_dict": ...}``) or saved from
    ``DataParallel`` (``module.`` prefixes)."""
    if not isinstance(ckpt, dict):
        raise ValueError(f"{name} holds a {type(ckpt).__name__}, not a state dict")
    for key in ("model", "state_dict"):
        if isinstance(ckpt.get(key), dict) and "patch_embed.proj.weight" not in ckpt:
            ckpt = ckpt[key]
            break
    state = {key: value for key, value in ckpt.items() if isinstance(value, Tensor)}
    if not state:
        raise ValueError(f"{name} is neither a vit checkpoint or export (no {CONFIG_KEY!r}) nor a state dict: it holds "
                         f"no tensors (its keys: {', '.join(map(str, list(ckpt)[:8]))})")
    if state and all(key.startswith("module.") for key in state):
        state = {key[len("module."):]: value for key, value in state.items()}
    return state


# ---- adapting ----------------------------------------------------------------------------------------------------

def _check_architecture(config: dict, requested: dict, name: str) -> None:
    for field in CHECKED:
        if field not in requested:
            continue
        given, stored = requested[field], config[field]
        same = math.isclose(given, stored) if field == "mlp_ratio" else given == stored
        if not same:
            raise ValueError(f"{field} is {given} but the pretrained weights in {name} have {field} {stored}: "
                             f"drop --model.{field} (the architecture comes from the weights) or set it to {stored}")


def _resample_linear_patches(weight: Tensor, old: int, new: int, channels: int, name: str) -> Tensor:
    """Our patch embedding's ``(dim, p*p*c)`` Linear weight, over ``(p1 p2 c)`` patches, for another patch size."""
    if weight.shape[1] != old * old * channels:
        raise ValueError(f"patch_embed.proj.weight in {name} has shape {tuple(weight.shape)}, not (dim, "
                         f"{old}*{old}*{channels}) as its config says")
    kernels = rearrange(weight.float(), "d (p1 p2 c) -> d c p1 p2", p1=old, p2=old)
    return rearrange(resample_patch_kernels(kernels, new), "d c p1 p2 -> d (p1 p2 c)")
