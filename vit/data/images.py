"""Decoding image files to 8-bit RGB, and the resize-and-centre-crop that datasets and tools share. No Lightning."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor



def open_rgb(path: str | os.PathLike, min_size: int | None = None) -> Image.Image:
    """An image file as an 8-bit RGB PIL image, oriented as a viewer shows it (its EXIF orientation applied).

    Grey, palette (transparency included), RGBA/LA (alpha dropped, as torchvision's loader does), CMYK and YCbCr
    images are converted to RGB; 16-bit grey is scaled to 8 bits (``round(v / 257)``) rather than clipped.
    ``min_size``: a JPEG may be decoded at a reduced DCT scale (1/2, 1/4, 1/8) that keeps both sides at least this
    large, much faster for large photos. The file is closed on return.

    Raises ``OSError`` (PIL's ``UnidentifiedImageError`` included) for a file that is not a readable image and
    PIL's ``DecompressionBombError`` for one too large to decode safely.
    """
    with Image.open(path) as opened:
        if min_size is not None and opened.format == "JPEG":
            opened.draft("RGB", (min_size, min_size))
        image = ImageOps.exif_transpose(opened)  # loads the pixels; a new image either way
        if image.mode.startswith("I"):  # 16-bit grey (PNG, TIFF): convert("RGB") would clip all above 255 to white
            grey = (np.asarray(image, dtype=np.float64) / 257).round().clip(0, 255).astype(np.uint8)
            image = Image.fromarray(grey)
        elif image.mode == "PA" or image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")  # PIL wants palette transparency resolved through RGBA
        return image if image.mode == "RGB" else image.convert("RGB")


def decode_image(path: str | os.PathLike) -> Tensor:
    """An image file as a uint8 RGB tensor ``(3, H, W)`` at its own size; see :func:`open_rgb`."""
    return torch.from_numpy(np.array(open_rgb(path))).permute(2, 0, 1)


def resize_crop(image: Image.Image, image_size: int, resize_size: int | None = None) -> np.ndarray:
    """The centre ``image_size`` square of ``image`` after resizing its shorter side to ``resize_size`` (default
    ``image_size``), as uint8 ``(3, image_size, image_size)``.

    torchvision's ``Resize(resize_size)`` + ``CenterCrop(image_size)`` geometry (longer side
    ``int(resize_size * long / short)``, crop offset ``round((size - image_size) / 2)``), done as one bicubic,
    antialiased resampling of the crop's box in the original image.
    """
    resize_size = resize_size or image_size
    w, h = image.size
    if w <= h:
        rw, rh = resize_size, int(resize_size * h / w)
    else:
        rw, rh = int(resize_size * w / h), resize_size
    left, top = int(round((rw - image_size) / 2)), int(round((rh - image_size) / 2))
    sx, sy = w / rw, h / rh
    box = (left * sx, top * sy, (left + image_size) * sx, (top + image_size) * sy)
    out = image.resize((image_size, image_size), Image.Resampling.BICUBIC, box=box)
    return np.asarray(out).transpose(2, 0, 1)
