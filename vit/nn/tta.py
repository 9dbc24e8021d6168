"""Test-time augmentation: average a classifier's predictions over a few views of each image."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def views(images: Tensor, flip: bool = False, shift: int = 0) -> Tensor:
    """The images, then (shift > 0) copies moved ``shift`` pixels down-right and up-left, then (flip) the mirror
    image of each of those: (V * B, C, H, W), view-major.

    The shifted copies are cut from a reflect-padded image, so no view has blank borders; they are airbench's
    translated views, the cheapest test-time views that still differ from the flip.
    """
    if shift < 0 or shift >= min(images.shape[-2:]):
        raise ValueError(f"shift must be in [0, {min(images.shape[-2:])}) pixels for {tuple(images.shape[-2:])} "
                         f"images, got {shift}")
    out = [images]
    if shift:
        h, w = images.shape[-2:]
        padded = F.pad(images, (shift, shift, shift, shift), mode="reflect")
        out += [padded[..., :h, :w], padded[..., 2 * shift:, 2 * shift:]]
    if flip:
        out += [view.flip(-1) for view in out]
    return torch.cat(out)


def tta_probs(model: nn.Module, images: Tensor, flip: bool = False, shift: int = 0) -> Tensor:
    """Class probabilities averaged over :func:`views` of each image: (B, num_classes).

    The views run as one batch, so a flip and a shift cost one forward pass of 6 * B images.
    """
    probs = model(views(images, flip, shift)).float().softmax(-1)  # (V * B, classes)
    return probs.unflatten(0, (-1, images.shape[0])).mean(0)
