"""Classify image files with a trained ViT.

    vit-predict --ckpt_path run.ckpt cat.png photos/ --top_k 3 --output predictions.csv

Image files (PNG, JPEG, WebP, BMP, TIFF, GIF) of any size are resized to the model's input size and normalised as in training (CIFAR-10
channel statistics). A file that cannot be read as an image gets an error line and the others still run; the
exit code is 1 only when no file could be classified.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import torch
from PIL import Image

from vit.tools.common import (
    ToolParser, check_output_path, class_names, find_images, load_image, load_model_or_exit, parse_device, predict,
)


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(prog="vit-predict", description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="image files and folders of images")
    parser.add_argument("--ckpt_path", required=True, help="training checkpoint (.ckpt) or .safetensors export")
    parser.add_argument("--weights", choices=["model", "ema"], default="model", help="which weights of a checkpoint")
    parser.add_argument("--top_k", type=int, default=5, help="classes to report per image")
    parser.add_argument("--output", help="also write the predictions to a .csv or .json file")
    parser.add_argument("--batch_size", type=int, default=64, help="images per forward pass")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        parser.error(f"--top_k must be positive, got {args.top_k}")
    if args.batch_size < 1:
        parser.error(f"--batch_size must be positive, got {args.batch_size}")
    check_output_path(parser, "--output", args.output, {".csv", ".json"})
    device = parse_device(parser, args.device)
    files = find_images(args.inputs)
    if not files:
        parser.error(f"no image files in {args.inputs}")

    model = load_model_or_exit(parser, args.ckpt_path, weights=args.weights).to(device)
    if model.in_channels != 3 or model.num_classes == 0:
        parser.error(f"{args.ckpt_path} is not an RGB classifier (in_channels={model.in_channels}, "
                     f"num_classes={model.num_classes})")
    names = class_names(model)
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
