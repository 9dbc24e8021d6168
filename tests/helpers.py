"""What many tests build: a tiny ViT and a training checkpoint of one (as vit.ViTClassifier writes them)."""

from pathlib import Path

import torch

import vit
from vit.weights import CONFIG_KEY


def tiny_vit(**overrides) -> vit.ViT:
    """A 2-block, 32-wide ViT on 16x16 images with 4x4 patches (16 tokens + CLS) and 5 classes."""
    config = dict(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, heads=2)
    return vit.ViT(**{**config, **overrides})


def write_training_checkpoint(path, model: vit.ViT | None = None, **extra) -> Path:
    """A training checkpoint of ``model`` (default: ``tiny_vit()``) at ``path``: its weights under ``model.``
    and its config, as ``ViTClassifier`` saves them; ``extra`` adds or replaces top-level entries."""
    model = model if model is not None else tiny_vit()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    torch.save({"state_dict": state, CONFIG_KEY: model.config.to_dict(), **extra}, path)
    return path
