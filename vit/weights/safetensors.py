"""Safetensors exports: the weights with the config in the header, loaded back in one call without pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vit.nn.config import ViTConfig
from vit.nn.vit import ViT
from vit.weights.checkpoint import CONFIG_KEY, DATA_KEY


def save_safetensors(model: ViT, path: str | os.PathLike) -> None:
    """Write ``model``'s weights to ``path`` with its config (and ``data_info``) in the header, and the config as
    ``<stem>.json``.

    The JSON beside the weights is for people and tools that do not read safetensors headers; loading reads
    the header, so the ``.safetensors`` file alone is enough.
    """
    path = Path(path)
    if path.with_suffix(".json") == path:
        raise ValueError(f"{str(path)!r}: the weights need a suffix other than .json (e.g. .safetensors), as the "
                         "config is written beside them as <stem>.json")
    config = model.config.to_dict()
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    metadata = {CONFIG_KEY: json.dumps(config)}
    if model.data_info is not None:
        metadata[DATA_KEY] = json.dumps(model.data_info)
    save_file(state, path, metadata=metadata)
    path.with_suffix(".json").write_text(json.dumps(config, indent=2) + "\n")


def read_safetensors(path: str | os.PathLike) -> tuple[dict, dict]:
    """The tensors and the header metadata of any safetensors file; an unreadable one is a ``ValueError``."""
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            state = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as err:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from None
    return state, metadata


def load_safetensors(path: str | os.PathLike) -> ViT:
    """The ``ViT`` saved by :func:`save_safetensors` at ``path``, in eval mode (as every loader): config from the
    header, then the weights, in the dtype they were saved in."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"safetensors file {str(path)!r} does not exist")
    state, metadata = read_safetensors(path)
    if CONFIG_KEY not in metadata:
        raise ValueError(
            f"{str(path)!r} has no {CONFIG_KEY!r} in its metadata: it was not written by ViT.save_safetensors. "
            "Build the ViT yourself and call model.load_state_dict(safetensors.torch.load_file(path))"
        )
    model = ViT(ViTConfig.from_dict(json.loads(metadata[CONFIG_KEY])))
    if "pos_embed" in state:
        model.to(state["pos_embed"].dtype)  # as saved: a bf16 export loads as bf16
    model.load_state_dict(state)
    model.data_info = json.loads(metadata[DATA_KEY]) if DATA_KEY in metadata else None
    return model.eval()
