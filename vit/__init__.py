"""vit: a Vision Transformer for image classification.

The package is layered, each layer importing only those below it:

- ``vit.nn``: the network (``ViT``, ``ViTConfig``, ``MultiHeadAttention``, ``attend``), plain PyTorch and einops;
- ``vit.weights``: training checkpoints, safetensors exports and timm weights into and out of a ``ViT``;
- ``vit.data``: datasets, their files and batched augmentation; ``vit.train``: the LightningModule, optimizer,
  callbacks and the ``train.py`` command line; ``vit.tools``: ``vit-predict``, ``vit-export``,
  ``vit-attention-maps``.

``import vit`` loads the network and the weight loaders; the Lightning pieces (``ViTClassifier``,
``CIFAR10DataModule``) load when first used.
"""

from vit.nn import SIZES, Block, MultiHeadAttention, ViT, ViTConfig, attend, attention_rollout, patchify, size_config
from vit.nn import unpatchify
from vit.train.optim import MuonAdamW
from vit.weights import load_checkpoint, load_pretrained, load_safetensors, save_safetensors, vit_from_timm

__all__ = [
    "SIZES",
    "Block",
    "CIFAR10DataModule",
    "MultiHeadAttention",
    "MuonAdamW",
    "ViT",
    "ViTClassifier",
    "ViTConfig",
    "attend",
    "attention_rollout",
    "load_checkpoint",
    "load_pretrained",
    "load_safetensors",
    "patchify",
    "save_safetensors",
    "size_config",
    "unpatchify",
    "vit_from_timm",
]

_LAZY = {"ViTClassifier": "vit.train.classifier", "CIFAR10DataModule": "vit.data.datamodule"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")
