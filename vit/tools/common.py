"""What the tools share: loading a model and image files, and checking paths and devices up front."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from vit.data.cifar10 import CIFAR10_CLASSES, normalize
from vit.nn.vit import ViT
from vit.weights import load_checkpoint, load_safetensors

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}  # what a folder is searched for; files named explicitly are all tried


def load_model(
    path: str | os.PathLike, *, weights: str = "model", image_size: int | Sequence[int] | None = None
) -> ViT:
    """A ``ViT`` in eval mode from a training checkpoint or a ``.safetensors`` export, optionally resized.

    ``image_size``: an int, or ``(H, W)``; a one-element sequence means a square.
    """
    if image_size is not None and not isinstance(image_size, int):
        if len(image_size) not in (1, 2):
            raise ValueError(f"image_size must be H or H W, got {list(image_size)}")
        image_size = image_size[0] if len(image_size) == 1 else tuple(image_size)
    if Path(path).suffix == ".safetensors":
        if weights != "model":
            raise ValueError(f"{str(path)!r} is an export, which holds one set of weights: --weights {weights} is "
                             "for training checkpoints (export the weight average with vit-export --weights ema)")
        model = load_safetensors(path)
        if image_size is not None:
            model.resize_pos_embed(image_size)
    else:
        model = load_checkpoint(path, weights=weights, image_size=image_size)
    return model  # both loaders return eval mode


def load_model_or_exit(parser: argparse.ArgumentParser, path: str, **kwargs) -> ViT:
    """:func:`load_model` for a command line: a missing, unreadable or unsafe file is one ``error:`` line, exit 2."""
    try:
        return load_model(path, **kwargs)
    except (OSError, ValueError) as err:
        parser.error(str(err))


def check_output_path(parser: argparse.ArgumentParser, option: str, path: str | None,
                      suffixes: Iterable[str] | None = None) -> None:
    """One ``error:`` line before any work when ``path`` cannot be written: a missing folder or a wrong suffix."""
    if path is None:
        return
    if suffixes is not None and Path(path).suffix.lower() not in suffixes:
        parser.error(f"{option} must end in {' or '.join(sorted(suffixes))}, got {path!r}")
    if not Path(path).resolve().parent.is_dir():
        parser.error(f"{option} {path!r}: the folder {str(Path(path).parent)!r} does not exist")


def parse_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """``--device`` as a ``torch.device`` that exists here, or one ``error:`` line."""
    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"unknown --device {name!r}; use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: no CUDA GPU is available here")
    return device


def class_names(num_classes: int) -> list[str]:
    """CIFAR-10's class names for a 10-class model, else the class indices as strings."""
    return list(CIFAR10_CLASSES) if num_classes == len(CIFAR10_CLASSES) else [str(i) for i in range(num_classes)]


def load_image(path: str | os.PathLike, size: tuple[int, int]) -> Tensor:
    """An image file as uint8 RGB ``(3, H, W)``, resized (bicubic, antialiased) to ``size = (H, W)``.

    The EXIF orientation of photos is applied first, so the model sees them as a viewer shows them. Raises
    ``OSError`` (PIL's ``UnidentifiedImageError`` included) when the file is not a readable image, and PIL's
    ``DecompressionBombError`` for one too large to decode safely.
    """
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode.startswith("I"):  # 16-bit grey (PNG): convert("RGB") would clip all above 255 to white
            image = Image.fromarray((np.asarray(image, dtype=np.float64) / 257).round().clip(0, 255).astype(np.uint8))
        image = image.convert("RGB").resize((size[1], size[0]), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given, and the PNG/JPEG files in folders (recursively, sorted)."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        else:
            found.append(path)
    return found


@torch.no_grad()
def predict(model: ViT, images: Tensor) -> Tensor:
    """Class probabilities ``(B, num_classes)`` of uint8 images ``(B, 3, H, W)`` at the model's size.

    Decoded 8-bit images are finite by construction, so this is where the tools need no NaN scan of the pixels
    (the network checks shapes and dtypes only, never values, which would wait for the device).
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images (as decoded from files), got {images.dtype}")
    weights = model.pos_embed
    return model(normalize(images).to(device=weights.device, dtype=weights.dtype)).float().softmax(dim=-1).cpu()
