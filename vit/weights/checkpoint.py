"""Training checkpoints: read safely (tensors and plain data only, never arbitrary pickled objects) into a ``ViT``."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

from vit.nn.config import ViTConfig, pair
from vit.nn.vit import ViT

# The key under which training checkpoints and safetensors headers store ``ViTConfig.to_dict()``, and the
# state-dict prefixes of the trained weights and of their exponential moving average in a training checkpoint
# (the attributes ``model`` and ``ema_model`` of ``vit.ViTClassifier``).
CONFIG_KEY = "vit_config"
# ... and under which they store ``ViT.data_info``: class names, mean and std of the training data.
DATA_KEY = "vit_data"
PREFIXES = {"model": "model.", "ema": "ema_model."}


def load_checkpoint_file(path: str | os.PathLike) -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)``; errors name the file and what is wrong.

    ``weights_only`` restricts unpickling to tensors and primitive containers, so a file crafted to run code
    when unpickled is refused instead of executed.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint {str(path)!r} is a folder, not a checkpoint file: pass a .ckpt file in "
                                "it (e.g. <run>/checkpoints/best.ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        with open(path, "rb") as f:
            pickled = f.read(1) == b"\x80"  # a pickle's first opcode (PROTO)
        if not (pickled or zipfile.is_zipfile(path)):  # torch.save writes a zip archive around the pickle
            raise ValueError(
                f"{str(path)!r} is not a readable PyTorch checkpoint (neither a zip archive nor a pickle)"
            ) from None
        # torch's message goes on to suggest weights_only=False, the very thing not to do with an untrusted file
        detail = next((line.strip() for line in str(err).splitlines() if "Unsupported global" in line), "")
        raise ValueError(
            f"refused to load {str(path)!r}: it contains objects other than tensors and plain data, which could "
            f"run code when unpickled" + (f" ({detail})" if detail else "")
        ) from None
    except Exception as err:  # noqa: BLE001 - a foreign or truncated file fails in many ways inside the (legacy) unpickler
        raise ValueError(f"{str(path)!r} is not a readable PyTorch checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{str(path)!r} is not a vit training checkpoint: it has no 'state_dict'")
    return ckpt


def vit_weights(ckpt: dict, path: str | os.PathLike, weights: str = "model") -> tuple[dict, dict]:
    """The ViT constructor arguments and state dict of a training checkpoint (``weights``: "model" or "ema")."""
    if weights not in PREFIXES:
        raise ValueError(f"unknown weights {weights!r}; choose one of {sorted(PREFIXES)}")
    if CONFIG_KEY not in ckpt:
        raise ValueError(f"{str(path)!r} has no {CONFIG_KEY!r}: it was not written by vit.ViTClassifier")
    prefix = PREFIXES[weights]
    state = {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    if not state:
        raise ValueError(f"{str(path)!r} holds no {weights!r} weights (no keys starting with {prefix!r})")
    return dict(ckpt[CONFIG_KEY]), state


def load_checkpoint(
    path: str | os.PathLike,
    *,
    weights: str = "model",
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
) -> ViT:
    """The plain ``ViT`` of a training checkpoint written by ``vit.ViTClassifier``, weights loaded, in eval mode.

    ``weights="ema"`` takes the exponential moving average of the weights, when the run kept one.
    ``image_size`` adapts the model to another input size (see ``ViT.resize_pos_embed``); ``num_classes`` gives it
    a new, freshly initialised head for that many classes (0: no head, a backbone returning pooled features), for
    fine-tuning. The file is read with ``torch.load(weights_only=True)``: loading it cannot run code.

    Every loader returns eval mode, ready to predict: a run's config may hold training-only randomness
    (``patch_drop`` drops tokens, ``dropout``) that would otherwise make every forward differ. Call
    ``.train()`` to fine-tune.
    """
    ckpt = load_checkpoint_file(path)
    config, state = vit_weights(ckpt, path, weights)
    model = ViT(ViTConfig.from_dict(config))
    model.load_state_dict(state)
    model.data_info = ckpt.get(DATA_KEY)
    if image_size is not None:
        model.resize_pos_embed(pair(image_size))
    if num_classes is not None and num_classes != model.num_classes:
        model.reset_classifier(num_classes)
    return model.eval()
