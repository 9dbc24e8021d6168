"""Batched augmentation of uint8 image tensors on the training device: no per-image PIL work.

``BatchAugment`` runs the usual CIFAR recipe on a whole ``(B, C, H, W)`` uint8 batch, on whatever device it lives:
random crop with zero padding, horizontal flip, then TrivialAugment-Wide or RandAugment, then optional random
erasing. Every image draws its own op, magnitude and sign; the images are grouped by op, so each op runs once per
batch as one vectorised call. ``mix`` is batch-level Mixup/CutMix with soft targets, for the training step.

The policies use torchvision's ``TrivialAugmentWide`` / ``RandAugment`` op set and magnitude tables (31 bins,
nearest interpolation, fill 0) and reproduce its per-image uint8 tensor kernels pixel for pixel on CPU for CIFAR's
32x32 images (checked for every op, bin and sign in tests/test_augment.py), computed differently:

* the geometric ops build torchvision's float32 sampling grid per image and gather the nearest pixels from the uint8
  images instead of calling ``grid_sample``; rotations by +-90 degrees take the same path (torchvision: ``rot90``).
  The grid is summed elementwise where torchvision multiplies matrices: at some other sizes (seen at 24x40, not at
  the squares 24-224 tried) a coordinate can differ in the last bit and, on an exact half-pixel tie, pick the
  neighbouring pixel;
* Brightness, Color, Contrast and Sharpness blend with a per-image factor; torchvision's fused multiply-add is
  emulated by summing in float64 and rounding once to float32 (see ``_fused_add``);
* AutoContrast and Equalize are torchvision's own batched kernels (Equalize: PIL's LUT from each channel's
  histogram).

Torchvision's PIL kernels are separate implementations, not compared here. On CUDA the float rounding of the grids
and blends may differ from CPU by a pixel or a level in rare cases, as torchvision's own kernels do.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as TF

OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
SHEAR_X, SHEAR_Y, TRANSLATE_X, TRANSLATE_Y, ROTATE = range(1, 6)  # the geometric ops: contiguous, run as one call
SIGNED = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness")
NUM_MAGNITUDE_BINS = 31  # torchvision's default


def magnitude_table(policy: Literal["trivial", "randaugment"], height: int, width: int) -> Tensor:
    """``(len(OPS), NUM_MAGNITUDE_BINS)`` float64 magnitudes per op and bin, as torchvision's ``_AUGMENTATION_SPACE``.

    Ops without a magnitude get zeros. The values are built in float32 like torchvision's and then widened, so
    ``float(table[op, bin])`` equals the Python float torchvision passes to its kernels.
    """
    n = NUM_MAGNITUDE_BINS
    bins = torch.arange(n)
    if policy == "trivial":
        shear, translate, rotate, enhance = 0.99, (32.0, 32.0), 135.0, 0.99
        posterize = (8 - bins / ((n - 1) / 6)).round()
    else:
        shear, translate, rotate, enhance = 0.3, (150.0 / 331.0 * width, 150.0 / 331.0 * height), 30.0, 0.9
        posterize = (8 - bins / ((n - 1) / 4)).round()
    ranges = {
        "ShearX": shear,
        "ShearY": shear,
        "TranslateX": translate[0],
        "TranslateY": translate[1],
        "Rotate": rotate,
        "Brightness": enhance,
        "Color": enhance,
        "Contrast": enhance,
        "Sharpness": enhance,
    }
    table = torch.zeros(len(OPS), n)
    for name, top in ranges.items():
        table[OPS.index(name)] = torch.linspace(0.0, top, n)
    table[OPS.index("Posterize")] = posterize
    table[OPS.index("Solarize")] = torch.linspace(1.0, 0.0, n)
    return table.double()


# ---- the ops: each takes a (N, C, H, W) uint8 chunk and (N,) float64 magnitudes, returns uint8 ------------------


def _inverse_affine(angle: Tensor, translate: Tensor, shear: Tensor, center: Tensor) -> Tensor:
    """Per-image ``(N, 2, 3)`` output-to-input pixel maps; torchvision's ``_get_inverse_affine_matrix`` (scale 1).

    ``angle`` (N,) and ``shear`` (N, 2) in degrees; ``translate`` and ``center`` (N, 2) in pixels, the centre
    relative to the image centre. Same float64 arithmetic in the same order as torchvision, so the grids match.
    """
    rot, sx, sy = angle.deg2rad(), shear[:, 0].deg2rad(), shear[:, 1].deg2rad()
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    (cx, cy), (tx, ty) = center.unbind(1), translate.unbind(1)
    e = cx - d * (cx + tx) + b * (cy + ty)
    f = cy + c * (cx + tx) - a * (cy + ty)
    return torch.stack([d, -b, e, -c, a, f], dim=1).view(-1, 2, 3)


def _affine(images: Tensor, op: Tensor, magnitude: Tensor) -> Tensor:
    """ShearX/Y, TranslateX/Y and Rotate, each image by its own op: one affine grid and one gather."""
    n, _, h, w = images.shape

    def where_op(k: int, value: Tensor) -> Tensor:
        return torch.where(op == k, value, 0.0)

    # The arguments of torchvision's F.affine / F.rotate calls: shears by atan(m) in degrees about the top-left
    # corner (its center=[0, 0]), translations by int(m) pixels, and F.rotate takes the angle mod 360 and hands the
    # affine matrix its negative.
    shear = torch.atan(magnitude).rad2deg()
    shear = torch.stack([where_op(SHEAR_X, shear), where_op(SHEAR_Y, shear)], dim=1)  # (N, 2)
    corner = torch.tensor([-0.5 * w, -0.5 * h], dtype=torch.float64, device=images.device)
    center = ((op == SHEAR_X) | (op == SHEAR_Y)).unsqueeze(1) * corner  # (N, 2)
    shift = magnitude.trunc()
    translate = torch.stack([where_op(TRANSLATE_X, shift), where_op(TRANSLATE_Y, shift)], dim=1)  # (N, 2)
    angle = where_op(ROTATE, -(magnitude % 360))
    theta = _inverse_affine(angle, translate, shear, center).float()  # (N, 2, 3)

    # torchvision's _affine_grid: pixel-centre coordinates about the image centre, mapped, then normalised to [-1, 1]
    # by folding 1 / (size / 2) into theta; x * t0 + y * t1 + t2 equal its bmm's float32 sums at 32x32 (the tests),
    # not at every size (see the module docstring).
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, device=images.device).view(1, 1, w)
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, device=images.device).view(1, h, 1)
    theta = theta / torch.tensor([0.5 * w, 0.5 * h], device=images.device).view(1, 2, 1)
    t = theta.view(n, 2, 3, 1, 1)
    gx, gy = (xs * t[:, i, 0] + ys * t[:, i, 1] + t[:, i, 2] for i in (0, 1))  # (N, H, W) each
    # grid_sample(mode="nearest", align_corners=False) reads pixel round((g + 1) * size / 2 - 0.5), half to even, and
    # zero outside the image. Gathering from the uint8 images with a zero border, coordinates clamped onto it, does
    # the same without dtype conversions or masks.
    ix = ((gx + 1) * (0.5 * w) - 0.5).round_().clamp_(-1, w) + 1
    iy = ((gy + 1) * (0.5 * h) - 0.5).round_().clamp_(-1, h) + 1
    index = (iy * (w + 2) + ix).long().view(n, 1, -1).expand(-1, images.shape[1], -1)  # (N, C, H*W)
    return F.pad(images, (1, 1, 1, 1)).flatten(2).gather(2, index).view_as(images)


def _blend(images: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    """``factor * images + (1 - factor) * other``, clamped and truncated to uint8 (torchvision's ``_blend``)."""
    factor = factor.view(-1, 1, 1, 1)
    out = _fused_add(images.float() * factor.float(), other, 1.0 - factor)
    return out.clamp_(0, 255).to(torch.uint8)


def _fused_add(x: Tensor, y: Tensor, alpha: Tensor) -> Tensor:
    """``x + alpha * y`` in float32 with one rounding, like torchvision's ``x.add_(y, alpha=a)`` (a fused
    multiply-add on CPU), but with a per-image ``alpha``. Float64 holds ``alpha * y`` exactly, so the sum is
    rounded once to float32 (bar double-rounding ties); otherwise values a hair off an integer truncate the other way.
    """
    return (x.double() + y.double() * alpha.float().double()).float()


def _grayscale(images: Tensor) -> Tensor:
    """``(N, 1, H, W)`` float luma, floored like torchvision does for integer images."""
    r, g, b = images.float().unbind(1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).floor_().unsqueeze(1)


def _brightness(images: Tensor, magnitude: Tensor) -> Tensor:
    return _blend(images, torch.zeros((), device=images.device), 1.0 + magnitude)


def _color(images: Tensor, magnitude: Tensor) -> Tensor:
    return _blend(images, _grayscale(images), 1.0 + magnitude)


def _contrast(images: Tensor, magnitude: Tensor) -> Tensor:
    return _blend(images, _grayscale(images).mean(dim=(1, 2, 3), keepdim=True), 1.0 + magnitude)


def _sharpness(images: Tensor, magnitude: Tensor) -> Tensor:
    """Blend towards a 3x3 smoothed copy; like torchvision, the one-pixel border is left as it is."""
    out = images.float()
    inner = out[..., 1:-1, 1:-1]  # a view: blending it in place keeps the border exact
    # torchvision's depthwise conv2d with [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, as shifted sums (conv2d is slow on
    # small CPU batches). Summation order can't change the rounded result: k / 13 is never within 1/26 of a tie.
    rows = out[..., :-2, :] + out[..., 1:-1, :] + out[..., 2:, :]  # (N, C, H-2, W)
    box = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:]  # (N, C, H-2, W-2)
    blurred = ((box + 4 * inner) / 13).round_()
    inner.copy_(_fused_add(inner, blurred - inner, (1.0 - (1.0 + magnitude)).view(-1, 1, 1, 1)))
    return out.clamp_(0, 255).to(torch.uint8)


def _posterize(images: Tensor, magnitude: Tensor) -> Tensor:
    """Keep the top ``magnitude`` bits of each value."""
    bits = magnitude.to(torch.int64)
    mask = (0xFF << (8 - bits)) & 0xFF  # (N,) 8 bits -> 0xFF
    return images & mask.to(torch.uint8).view(-1, 1, 1, 1)


def _solarize(images: Tensor, magnitude: Tensor) -> Tensor:
    """Invert every value at or above ``255 * magnitude``."""
    threshold = (255.0 * magnitude).float().view(-1, 1, 1, 1)
    return torch.where(images >= threshold, images.bitwise_not(), images)


def _autocontrast(images: Tensor, magnitude: Tensor) -> Tensor:
    return TF.autocontrast(images)  # already batched, per image and channel


def _equalize(images: Tensor, magnitude: Tensor) -> Tensor:
    return TF.equalize(images)  # already batched: a PIL-style LUT from each image's per-channel histogram


_PIXEL_OPS = {
    OPS.index("Brightness"): _brightness,
    OPS.index("Color"): _color,
    OPS.index("Contrast"): _contrast,
    OPS.index("Sharpness"): _sharpness,
    OPS.index("Posterize"): _posterize,
    OPS.index("Solarize"): _solarize,
    OPS.index("AutoContrast"): _autocontrast,
    OPS.index("Equalize"): _equalize,
}


def apply_ops(images: Tensor, op: Tensor, magnitude: Tensor) -> Tensor:
    """Apply ``OPS[op[i]]`` with ``magnitude[i]`` to ``images[i]`` for a ``(B, 3, H, W)`` uint8 batch.

    ``op`` is (B,) int64, ``magnitude`` (B,) float64 with the sign already applied. Images are sorted by op so
    every op sees one contiguous chunk; the five geometric ops share one affine resampling.
    """
    order = op.argsort()
    counts = torch.bincount(op, minlength=len(OPS)).tolist()  # the one host sync per call
    start = [0, *itertools.accumulate(counts)]
    images, op, magnitude = images.index_select(0, order), op[order], magnitude[order]
    chunks = [(slice(start[SHEAR_X], start[ROTATE + 1]), None)]
    chunks += [(slice(start[k], start[k + 1]), fn) for k, fn in _PIXEL_OPS.items()]
    for s, fn in chunks:
        if s.start == s.stop:
            continue
        images[s] = _affine(images[s], op[s], magnitude[s]) if fn is None else fn(images[s], magnitude[s])
    return images.index_select(0, order.argsort())  # undo the sort


def _random_signs(op: Tensor, magnitude: Tensor) -> Tensor:
    """Negate the magnitude of signed ops with probability 1/2 per image."""
    signed = torch.tensor([name in SIGNED for name in OPS], device=op.device)[op]
    flip = signed & (torch.rand(op.shape, device=op.device) < 0.5)
    return torch.where(flip, -magnitude, magnitude)


def trivial_augment(images: Tensor) -> Tensor:
    """TrivialAugment-Wide: one uniformly drawn op per image at a uniformly drawn magnitude bin and sign."""
    b, _, h, w = images.shape
    table = magnitude_table("trivial", h, w).to(images.device)
    op = torch.randint(len(OPS), (b,), device=images.device)
    magnitude = table[op, torch.randint(NUM_MAGNITUDE_BINS, (b,), device=images.device)]
    return apply_ops(images, op, _random_signs(op, magnitude))


def rand_augment(images: Tensor, num_ops: int = 2, magnitude: int = 9) -> Tensor:
    """RandAugment: ``num_ops`` uniformly drawn ops in sequence per image, all at magnitude bin ``magnitude``."""
    b, _, h, w = images.shape
    table = magnitude_table("randaugment", h, w).to(images.device)
    for _ in range(num_ops):
        op = torch.randint(len(OPS), (b,), device=images.device)
        images = apply_ops(images, op, _random_signs(op, table[op, magnitude]))
    return images


# ---- crop and flip, erasing ----------------------------------------------------------------------------------------


def random_crop_flip(images: Tensor, padding: int, flip: bool) -> Tensor:
    """Zero-pad each side by ``padding``, take one random crop of the original size per image and, if ``flip``,
    mirror it left-right with probability 1/2: a single gather, as indexing with per-image offsets is ~10x slower.
    """
    b, c, h, w = images.shape
    padded = F.pad(images, (padding,) * 4) if padding else images
    top = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=images.device)
    cols = torch.arange(w, device=images.device).view(1, 1, w)
    if flip:
        cols = torch.where(torch.rand(b, 1, 1, device=images.device) < 0.5, cols.flip(-1), cols)  # (B, 1, W)
    rows = top + torch.arange(h, device=images.device).view(1, h, 1)  # (B, H, 1)
    index = rows * padded.shape[-1] + left + cols  # (B, H, W) into the flattened padded image
    return padded.flatten(2).gather(2, index.view(b, 1, h * w).expand(b, c, h * w)).view(b, c, h, w)


def random_erase(
    images: Tensor, prob: float, scale: tuple[float, float] = (0.02, 0.33), ratio: tuple[float, float] = (0.3, 3.3)
) -> Tensor:
    """Zero one random rectangle in each image with probability ``prob``, like torchvision's ``RandomErasing``.

    The rectangle covers a uniform ``scale`` fraction of the image with a log-uniform aspect ``ratio``; as in
    torchvision, up to 10 draws are tried per image and an image whose draws all overflow is left as it is.
    """
    b, _, h, w = images.shape
    tries = 10
    area = h * w * torch.empty(b, tries, device=images.device).uniform_(*scale)
    aspect = torch.empty(b, tries, device=images.device).uniform_(math.log(ratio[0]), math.log(ratio[1])).exp()
    eh = (area * aspect).sqrt().round().long()  # (B, tries)
    ew = (area / aspect).sqrt().round().long()
    fits = (eh < h) & (ew < w)
    first = fits.int().argmax(dim=1, keepdim=True)  # first fitting draw (0 if none fits: masked off below)
    eh, ew = eh.gather(1, first), ew.gather(1, first)  # (B, 1)
    erase = fits.any(dim=1, keepdim=True) & (torch.rand(b, 1, device=images.device) < prob)
    top = (torch.rand(b, 1, device=images.device) * (h - eh + 1)).long()
    left = (torch.rand(b, 1, device=images.device) * (w - ew + 1)).long()
    rows = torch.arange(h, device=images.device).view(1, h, 1)
    cols = torch.arange(w, device=images.device).view(1, 1, w)
    inside = (rows >= top.view(b, 1, 1)) & (rows < (top + eh).view(b, 1, 1))
    inside = inside & (cols >= left.view(b, 1, 1)) & (cols < (left + ew).view(b, 1, 1))  # (B, H, W)
    return images.masked_fill((inside & erase.view(b, 1, 1)).unsqueeze(1), 0)


class BatchAugment(nn.Module):
    """The CIFAR training augmentation on a whole ``(B, C, H, W)`` uint8 batch: crop, flip, policy, erasing.

    Args:
        crop_padding: zero padding on each side before the random crop (0 turns cropping off).
        flip: mirror left-right with probability 1/2.
        policy: ``"trivial"`` (TrivialAugment-Wide), ``"randaugment"`` or ``"none"``; see ``OPS``.
        num_ops: ops per image for RandAugment.
        magnitude: RandAugment's magnitude bin, 0 to 30.
        erasing: probability of zeroing a random rectangle in each image (0 turns it off).
    """

    def __init__(
        self,
        crop_padding: int = 4,
        flip: bool = True,
        policy: Literal["none", "trivial", "randaugment"] = "none",
        num_ops: int = 2,
        magnitude: int = 9,
        erasing: float = 0.0,
    ) -> None:
        super().__init__()
        if crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {crop_padding}")
        if policy not in ("none", "trivial", "randaugment"):
            raise ValueError(f"policy must be 'none', 'trivial' or 'randaugment', got {policy!r}")
        if num_ops < 0:
            raise ValueError(f"num_ops must be >= 0, got {num_ops}")
        if not 0 <= magnitude < NUM_MAGNITUDE_BINS:
            raise ValueError(f"magnitude must be in [0, {NUM_MAGNITUDE_BINS - 1}], got {magnitude}")
        if not 0.0 <= erasing <= 1.0:
            raise ValueError(f"erasing is a probability in [0, 1], got {erasing}")
        self.crop_padding = crop_padding
        self.flip = flip
        self.policy = policy
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.erasing = erasing

    def forward(self, images: Tensor) -> Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"expected a (B, C, H, W) uint8 batch, got {images.dtype} of shape {tuple(images.shape)}")
        if self.policy != "none" and images.shape[1] != 3:
            raise ValueError(f"policy {self.policy!r} needs RGB images, got {images.shape[1]} channels")
        if self.crop_padding or self.flip:
            images = random_crop_flip(images, self.crop_padding, self.flip)
        if self.policy == "trivial":
            images = trivial_augment(images)
        elif self.policy == "randaugment":
            images = rand_augment(images, self.num_ops, self.magnitude)
        if self.erasing > 0:
            images = random_erase(images, self.erasing)
        return images

    def extra_repr(self) -> str:
        return (
            f"crop_padding={self.crop_padding}, flip={self.flip}, policy={self.policy!r}, num_ops={self.num_ops}, "
            f"magnitude={self.magnitude}, erasing={self.erasing}"
        )


# ---- Mixup / CutMix -------------------------------------------------------------------------------------------


def mix(
    images: Tensor,
    targets: Tensor,
    num_classes: int,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Mixup or CutMix of a float ``(B, C, H, W)`` batch with its reverse, and the matching soft targets.

    timm's ``Mixup`` in batch mode: with probability ``prob`` the whole batch is mixed with ``images.flip(0)`` by one
    ``lam ~ Beta(alpha, alpha)``, using CutMix with probability ``switch_prob`` when both alphas are positive (an
    alpha of 0 turns its method off). CutMix pastes one box of the partner image and sets ``lam`` to the share of
    pixels that stayed after clipping the box to the image. Returns new tensors: images and ``(B, num_classes)``
    targets ``lam * smooth(y) + (1 - lam) * smooth(y.flip(0))`` whose rows sum to 1.
    """
    if mixup_alpha < 0 or cutmix_alpha < 0 or mixup_alpha == cutmix_alpha == 0:
        raise ValueError(f"need mixup_alpha >= 0, cutmix_alpha >= 0, one positive; got {mixup_alpha}, {cutmix_alpha}")
    off = label_smoothing / num_classes
    one_hot = torch.full((targets.shape[0], num_classes), off, device=images.device)
    one_hot.scatter_(1, targets.view(-1, 1), 1.0 - label_smoothing + off)
    if torch.rand(()) >= prob:
        return images, one_hot
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha == 0 or torch.rand(()) < switch_prob)
    alpha = torch.tensor(cutmix_alpha if use_cutmix else mixup_alpha)
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    partner = images.flip(0)
    if use_cutmix:
        h, w = images.shape[-2:]
        cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = torch.randint(h, ()).item(), torch.randint(w, ()).item()
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
        images = images.clone()
        images[..., y0:y1, x0:x1] = partner[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        images = images * lam + partner * (1.0 - lam)
    return images, one_hot * lam + one_hot.flip(0) * (1.0 - lam)
