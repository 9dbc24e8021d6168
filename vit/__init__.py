"""vit: a Vision Transformer for image classification.

The network (``ViT``, ``MultiHeadAttention``, ``attend``, ``patchify``) and the optimizer (``MuonAdamW``) are
plain PyTorch. The training pieces (``ViTClassifier``, ``CIFAR10DataModule``) import Lightning, so they load only
when first used.
"""

from vit.attention import MultiHeadAttention, attend
from vit.model import SIZES, Block, ViT, patchify, size_config, unpatchify
from vit.optim import MuonAdamW
from vit.rollout import attention_rollout

__all__ = [
    "SIZES",
    "Block",
    "CIFAR10DataModule",
    "MultiHeadAttention",
    "MuonAdamW",
    "ViT",
    "ViTClassifier",
    "attend",
    "attention_rollout",
    "patchify",
    "size_config",
    "unpatchify",
]

_LAZY = {"ViTClassifier": "vit.lightning", "CIFAR10DataModule": "vit.data"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")
