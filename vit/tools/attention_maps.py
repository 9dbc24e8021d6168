"""Where the model looks: a PNG grid of images, their attention rollout overlaid, and the prediction.

    vit-attention-maps --ckpt_path run.ckpt --out attn.png --num_images 8   # CIFAR-10 test images
    vit-attention-maps --ckpt_path run.ckpt --out attn.png cat.png dog.jpg  # your own files
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor

from vit.data.cifar10 import CIFAR10_CLASSES, default_data_dir, read_cifar10
from vit.nn.rollout import attention_rollout
from vit.nn.vit import ViT
from vit.tools.common import (
    ToolParser, check_output_path, class_names, find_images, load_image, load_model_or_exit, normalize_for, predict,
)

TILE = 128  # images are shown at least this tall: CIFAR-10's 32 pixels are too small to read
CAPTION = 28  # pixels of text under each image pair
# A dark-blue -> cyan -> yellow -> red colour map for the rollout, as (position, RGB) stops.
COLORMAP = np.array([[0.0, 0.0, 0.0, 0.5], [0.35, 0.0, 0.8, 1.0], [0.65, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def heat_maps(model: ViT, images: Tensor, size: tuple[int, int]) -> Tensor:
    """Rollout of each normalised image over its patches, upsampled to ``size`` and scaled to 0-1: ``(B, H, W)``."""
    patches = attention_rollout(model, images.to(model.pos_embed.dtype))[:, 1:].float().reshape(-1, 1, *model.grid_size)
    heat = F.interpolate(patches, size=size, mode="bilinear", align_corners=False)[:, 0]
    low, high = heat.amin(dim=(1, 2), keepdim=True), heat.amax(dim=(1, 2), keepdim=True)
    return (heat - low) / (high - low).clamp_min(1e-12)


def colorize(heat: np.ndarray) -> np.ndarray:
    """0-1 values ``(H, W)`` -> RGB ``(H, W, 3)`` in 0-1 through ``COLORMAP``."""
    return np.stack([np.interp(heat, COLORMAP[:, 0], COLORMAP[:, c]) for c in (1, 2, 3)], axis=-1)


def render(images: Tensor, heat: Tensor, captions: Sequence[str], columns: int = 4) -> Image.Image:
    """A grid of (image | image with heat overlaid) pairs, each captioned; ``images`` uint8 ``(B, 3, H, W)``."""
    height, width = images.shape[-2:]
    pair_w, cell_h = 2 * width + 4, height + CAPTION
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    canvas = Image.new("RGB", (columns * (pair_w + 8), rows * (cell_h + 8)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (image, hmap, caption) in enumerate(zip(images, heat, captions)):
        x, y = (i % columns) * (pair_w + 8) + 4, (i // columns) * (cell_h + 8) + 4
        rgb = image.permute(1, 2, 0).numpy() / 255.0
        overlay = 0.45 * rgb + 0.55 * colorize(hmap.numpy())
        canvas.paste(Image.fromarray(image.permute(1, 2, 0).numpy()), (x, y))
        canvas.paste(Image.fromarray((overlay * 255).round().astype(np.uint8)), (x + width + 4, y))
        draw.text((x, y + height + 4), caption, fill="black")
    return canvas


def main(argv: list[str] | None = None) -> None:
    parser = ToolParser(prog="vit-attention-maps", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="image files and folders; without them, CIFAR-10 test images")
    parser.add_argument("--ckpt_path", required=True, help="training checkpoint (.ckpt) or .safetensors export")
    parser.add_argument("--weights", choices=["model", "ema"], default="model", help="which weights of a checkpoint")
    parser.add_argument("--out", default="attn.png", help="image to write (.png or .jpg)")
    parser.add_argument("--num_images", type=int, default=8, help="CIFAR-10 test images to show")
    parser.add_argument("--data_dir", help=f"CIFAR-10 folder (default: $VIT_DATA_DIR or {default_data_dir()!r})")
    args = parser.parse_args(argv)
    if args.files and args.data_dir:
        parser.error("pass image files or --data_dir, not both")
    if args.num_images < 1:
        parser.error(f"--num_images must be positive, got {args.num_images}")
    check_output_path(parser, "--out", args.out, {".png", ".jpg", ".jpeg"})
    files = find_images(args.files)
    if args.files and not files:
        parser.error(f"no image files in {args.files}")

    model = load_model_or_exit(parser, args.ckpt_path, weights=args.weights)
    if files:
        try:
            images = torch.stack([load_image(path, model.image_size) for path in files])
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            parser.error(f"{err}")
        truths = [""] * len(images)
    else:
        try:
            images, labels = read_cifar10(args.data_dir, train=False)
        except (OSError, ValueError) as err:
            parser.error(f"{str(err).splitlines()[0]}; pass --data_dir, set $VIT_DATA_DIR, or pass image files")
        images, labels = images[: args.num_images], labels[: args.num_images]
        if tuple(images.shape[-2:]) != model.image_size:
            images = F.interpolate(images.float(), size=model.image_size, mode="bicubic", antialias=True)
            images = images.round().clamp(0, 255).to(torch.uint8)
        truths = [f" (true {CIFAR10_CLASSES[y]})" for y in labels.tolist()]

    if model.num_classes:
        names = class_names(model)
        probs, indices = predict(model, images).max(dim=-1)
        captions = [f"{names[i]} {p:.2f}{truth}" for p, i, truth in zip(probs.tolist(), indices.tolist(), truths)]
    else:  # a backbone without head: where it looks, but no prediction
        captions = truths
    scale = max(1, -(-TILE // model.image_size[0]))
    shown = F.interpolate(images, scale_factor=scale, mode="nearest")
    heat = heat_maps(model, normalize_for(model, images), tuple(shown.shape[-2:]))
    render(shown, heat, captions).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
