"""Classify image files with a trained ViT.

    python -m vit.predict --ckpt_path run.ckpt cat.png photos/ --top-k 3 --output predictions.csv

PNG and JPEG files of any size are resized to the model's input size and normalised as in training (CIFAR-10
channel statistics). A file that cannot be read as an image gets an error line and the others still run; the
exit code is 1 only when no file could be classified.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from vit.cifar10 import CIFAR10_CLASSES, normalize
from vit.model import ViT

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
                             "for training checkpoints (export the weight average with vit.export --weights ema)")
        model = ViT.from_safetensors(path)
        if image_size is not None:
            model.resize_pos_embed(image_size)
    else:
        model = ViT.from_checkpoint(path, weights=weights, image_size=image_size)
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
    """Class probabilities ``(B, num_classes)`` of uint8 images ``(B, 3, H, W)`` at the model's size."""
    weights = model.pos_embed
    return model(normalize(images).to(device=weights.device, dtype=weights.dtype)).float().softmax(dim=-1).cpu()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vit-predict", description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="image files and folders of images")
    parser.add_argument("--ckpt_path", required=True, help="training checkpoint (.ckpt) or .safetensors export")
    parser.add_argument("--weights", choices=["model", "ema"], default="model", help="which weights of a checkpoint")
    parser.add_argument("--top-k", type=int, default=5, help="classes to report per image")
    parser.add_argument("--output", help="also write the predictions to a .csv or .json file")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        parser.error(f"--top-k must be positive, got {args.top_k}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be positive, got {args.batch_size}")
    check_output_path(parser, "--output", args.output, {".csv", ".json"})
    device = parse_device(parser, args.device)
    files = find_images(args.inputs)
    if not files:
        parser.error(f"no PNG/JPEG files in {args.inputs}")

    model = load_model_or_exit(parser, args.ckpt_path, weights=args.weights).to(device)
    if model.in_channels != 3 or model.num_classes == 0:
        parser.error(f"{args.ckpt_path} is not an RGB classifier (in_channels={model.in_channels}, "
                     f"num_classes={model.num_classes})")
    names = class_names(model.num_classes)
    k = min(args.top_k, model.num_classes)

    results: list[dict] = [{} for _ in files]  # one per file, in input order
    for start in range(0, len(files), args.batch_size):
        loaded, images = [], []
        for i in range(start, min(start + args.batch_size, len(files))):
            try:
                images.append(load_image(files[i], model.image_size))
                loaded.append(i)
            except (OSError, ValueError, Image.DecompressionBombError) as err:  # report it and carry on
                print(f"{files[i]}: error: {err}", file=sys.stderr)
                results[i] = dict(file=str(files[i]), error=str(err))
        if not images:
            continue
        top = predict(model, torch.stack(images)).topk(k, dim=-1)
        for i, probs, indices in zip(loaded, top.values.tolist(), top.indices.tolist()):
            preds = [dict(label=names[c], index=c, probability=p) for c, p in zip(indices, probs)]
            print(f"{files[i]}: " + ", ".join(f"{p['label']} {p['probability']:.3f}" for p in preds))
            results[i] = dict(file=str(files[i]), predictions=preds)

    if args.output:
        write_results(results, args.output)
    return 0 if any("predictions" in r for r in results) else 1


def write_results(results: list[dict], path: str | os.PathLike) -> None:
    """JSON: the list of per-file results; CSV: one row per file and rank (``error`` filled for failed files)."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(results, indent=2) + "\n")
        return
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "rank", "label", "index", "probability", "error"])
        for result in results:
            if "error" in result:
                writer.writerow([result["file"], "", "", "", "", result["error"]])
            for rank, p in enumerate(result.get("predictions", []), start=1):
                writer.writerow([result["file"], rank, p["label"], p["index"], f"{p['probability']:.6f}", ""])


if __name__ == "__main__":
    sys.exit(main())
