"""What the tools share: loading a model and image files, and checking paths and devices up front."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vit.data.cifar10 import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from vit.data.files import scan_images
from vit.data.images import open_rgb, resize_crop
from vit.nn.vit import ViT
from vit.weights import load_checkpoint, load_safetensors


class ToolParser(argparse.ArgumentParser):
    """The tools' argument parser: every long option in both spellings (``--top_k`` as declared, as LightningCLI
    writes options, and ``--top-k``), and an unknown option answered with the closest known one."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        known = {_spelling(o): o for a in self._actions for o in a.option_strings if o.startswith("--")}
        normalized = []
        for arg in args:
            name, eq, value = arg.partition("=")
            normalized.append(known.get(_spelling(name), name) + eq + value if name.startswith("--") else arg)
        return super().parse_known_args(normalized, namespace)

    def error(self, message: str):
        unknown = re.findall(r"(?:^|\s)(--[\w-]+)", message.partition("unrecognized arguments:")[2])
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        close = [m for u in unknown for m in difflib.get_close_matches(_spelling(u), options, n=1, cutoff=0.6)]
        super().error(message + (f" (did you mean {', '.join(close)}?)" if close else ""))


def _spelling(option: str) -> str:
    return "--" + option[2:].replace("-", "_")


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


def class_names(model: ViT) -> list[str]:
    """The model's class names: those its weights were trained with, else CIFAR-10's for a 10-class model without
    any (files written before names were stored), else the class indices as strings."""
    names = (model.data_info or {}).get("classes")
    if names and len(names) == model.num_classes:
        return list(names)
    if model.data_info is None and model.num_classes == len(CIFAR10_CLASSES):
        return list(CIFAR10_CLASSES)
    return [str(i) for i in range(model.num_classes)]


def normalize_for(model: ViT, images: Tensor) -> Tensor:
    """uint8 images -> what ``model`` was trained on: 0-1 pixels standardised with the mean and std of its training
    data (CIFAR-10's for a model whose files do not say), in the model's dtype and on its device."""
    info = model.data_info or {}
    mean, std = info.get("mean", CIFAR10_MEAN), info.get("std", CIFAR10_STD)
    weights = model.pos_embed
    mean = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return ((images.float() / 255 - mean) / std).to(device=weights.device, dtype=weights.dtype)


def load_image(path: str | os.PathLike, size: tuple[int, int]) -> Tensor:
    """An image file as uint8 RGB ``(3, H, W)`` at ``size = (H, W)``, prepared as the folder datasets prepare
    training images: for a square size, the shorter side resized to it and the centre cropped (one bicubic,
    antialiased resampling), else resized to ``size``.

    The EXIF orientation of photos is applied first, so the model sees them as a viewer shows them (see
    :func:`vit.data.images.open_rgb`). Raises ``OSError`` (PIL's ``UnidentifiedImageError`` included) when the file
    is empty or not a readable image, and PIL's ``DecompressionBombError`` for one too large to decode safely.
    """
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise OSError(f"{str(path)!r} is empty (0 bytes)")
    image = open_rgb(path)
    if size[0] == size[1]:
        return torch.from_numpy(resize_crop(image, size[0]).copy())
    return torch.from_numpy(np.array(image.resize((size[1], size[0]), Image.Resampling.BICUBIC))).permute(2, 0, 1)


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The image files of ``paths`` (files as given, folders scanned by :func:`vit.data.files.scan_images`); what a
    folder scan skipped (hidden, not an image, empty) is counted on stderr in one line."""
    scan = scan_images(paths)
    summary = scan.summary()
    if summary:
        print(summary, file=sys.stderr)
    return scan.images


@torch.no_grad()
def predict(model: ViT, images: Tensor) -> Tensor:
    """Class probabilities ``(B, num_classes)`` of uint8 images ``(B, 3, H, W)`` at the model's size.

    Decoded 8-bit images are finite by construction, so this is where the tools need no NaN scan of the pixels
    (the network checks shapes and dtypes only, never values, which would wait for the device).
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images (as decoded from files), got {images.dtype}")
    return model(normalize_for(model, images)).float().softmax(dim=-1).cpu()
