"""Write the transfer experiment's data: CIFAR-10 classes as JPEG class folders (the image-folder layout).

    OUT/train/<class>/NNNNN.jpg   100 per class from the first 45,000 training images (seeded)
    OUT/val/<class>/NNNNN.jpg     100 per class from the last 5,000 training images (the project's validation split)
    OUT/test/<class>/NNNNN.jpg    every test image of the class (1,000 per class)

for the classes dog, frog, horse, ship and truck (``--classes 5-9``). NNNNN is the image's index in its CIFAR-10
split, so any file can be traced back. JPEG quality 95. Pretraining uses the other five classes, every image of them
(``--classes 0-4 --train_per_class 0 --val_per_class 0``), so the two tasks share no class and no image.

    python scripts/make_transfer_folders.py OUT [--data_dir DIR] [--seed 0] [--train_per_class 100] [--classes 5-9]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from vit.data.cifar10 import CIFAR10_CLASSES, DATA_DIR_ENV, read_cifar10

REPO = Path(__file__).resolve().parents[1]
TRAIN_SIZE = 45_000  # the training images before the project's validation split (the last 5,000)
SPLITS = ("train", "val", "test")


def pick(labels: np.ndarray, indices: np.ndarray, classes: list[int], per_class: int | None,
         rng: np.random.Generator) -> dict[int, list]:
    """For each of ``classes``, ``per_class`` of ``indices`` drawn at random (all of them if None or 0), sorted."""
    chosen = {}
    for label in classes:
        pool = indices[labels[indices] == label]
        if per_class:
            if len(pool) < per_class:
                raise ValueError(f"class {CIFAR10_CLASSES[label]} has {len(pool)} images here, fewer than {per_class}")
            pool = rng.choice(pool, size=per_class, replace=False)
        chosen[label] = sorted(int(i) for i in pool)
    return chosen


def write(out: Path, split: str, images: np.ndarray, chosen: dict[int, list], quality: int) -> dict[str, int]:
    counts = {}
    for label, indices in chosen.items():
        folder = out / split / CIFAR10_CLASSES[label]
        folder.mkdir(parents=True)
        for i in indices:
            Image.fromarray(images[i].transpose(1, 2, 0)).save(folder / f"{i:05d}.jpg", quality=quality)
        counts[CIFAR10_CLASSES[label]] = len(indices)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write train/, val/ and test/ into")
    parser.add_argument("--data_dir", default=os.environ.get(DATA_DIR_ENV, str(REPO.parent / "shared" / "data")),
                        help=f"folder holding CIFAR-10 (default: ${DATA_DIR_ENV}, else ../shared/data)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", default="5-9", help="CIFAR-10 class indices, a range FIRST-LAST")
    parser.add_argument("--train_per_class", type=int, default=100, help="0: all of them")
    parser.add_argument("--val_per_class", type=int, default=100, help="0: all of them")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT's train/, val/ and test/ folders")
    args = parser.parse_args(argv)

    existing = [args.out / split for split in SPLITS if (args.out / split).exists()]
    if existing and not args.overwrite:
        sys.exit(f"{', '.join(map(str, existing))} already exist: pass --overwrite to replace them")
    for folder in existing:
        shutil.rmtree(folder)

    train_images, train_labels = (x.numpy() for x in read_cifar10(args.data_dir, train=True))
    test_images, test_labels = (x.numpy() for x in read_cifar10(args.data_dir, train=False))
    first, last = (int(x) for x in args.classes.split("-"))
    classes = list(range(first, last + 1))
    rng = np.random.default_rng(args.seed)
    chosen = {
        "train": pick(train_labels, np.arange(TRAIN_SIZE), classes, args.train_per_class, rng),
        "val": pick(train_labels, np.arange(TRAIN_SIZE, len(train_labels)), classes, args.val_per_class, rng),
        "test": pick(test_labels, np.arange(len(test_labels)), classes, None, rng),
    }
    sources = {"train": train_images, "val": train_images, "test": test_images}
    for split in SPLITS:
        counts = write(args.out, split, sources[split], chosen[split], args.quality)
        listed = ", ".join(f"{name} {n}" for name, n in counts.items())
        print(f"{split}: {sum(counts.values())} images ({listed}) in {args.out / split}")


if __name__ == "__main__":
    main()
