"""Training-augmentation throughput per CPU core: our batched pipeline against torchvision's per-image one.

All three pipelines do the same work, random crop (zero padding 4), horizontal flip, TrivialAugment-Wide, on
32x32 RGB uint8 CIFAR-sized images, with ``torch.set_num_threads(1)``:

* ``batched``: ``vit.data.augment.BatchAugment(policy="trivial")`` on a (256, 3, 32, 32) uint8 tensor;
* ``torchvision tensor``: ``transforms.v2`` Compose(RandomCrop, RandomHorizontalFlip, TrivialAugmentWide) called
  on each (3, 32, 32) uint8 tensor;
* ``torchvision PIL``: the same Compose plus ``PILToTensor`` on each PIL image, as a DataLoader worker would.

The pipelines run interleaved in one process for several rounds; the script prints the median images/s of each
and the ratio of ours to each torchvision one.

The folder case (``--case folder``) times an epoch over a class-folder tree of JPEGs: CIFAR-10 test images
(``read_cifar10`` from ``$VIT_DATA_DIR``, else ``../shared/data``) upscaled to 64x64 and written to a temporary
folder, ``--folder-images`` of them (default 5,000; up to 60,000 draws on the training images too):

* ``ImageFolderDataModule``: the one-off caching (decode, resize, write the memory map) in images/s, the time a
  later run takes to open the cache, then training epochs from the cache with the batched crop (padding 8) and
  flip and the normalisation, as ``on_after_batch_transfer`` runs them (in the main process, torch's threads);
* torchvision: ``ImageFolder`` with Resize(64) + CenterCrop(64) + RandomCrop(64, padding 8) + RandomHorizontalFlip
  + PILToTensor + ToDtype + Normalize per image, through ``DataLoader(num_workers=2, persistent_workers=True)``.

Both get a warm-up epoch (page cache, worker start), then ``--folder-rounds`` (3) epochs each, interleaved; it prints
the median epoch times and their ratio.

Run: ``python benchmarks/data.py`` (both cases; ``--case augment`` or ``--case folder`` for one, ``--quick`` for a
smoke run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import PIL.Image
import torch
from torchvision.transforms import v2

from vit.data.augment import BatchAugment


def images_per_second(fn, images, num_images: int) -> float:
    start = time.perf_counter()
    fn(images)
    return num_images / (time.perf_counter() - start)


def augment_case(args) -> None:
    rounds, batches = (2, 2) if args.quick else (args.rounds, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    num_images = batches * args.batch_size
    data = torch.randint(0, 256, (num_images, 3, 32, 32), dtype=torch.uint8)
    pil_images = [PIL.Image.fromarray(image.permute(1, 2, 0).numpy()) for image in data]
    per_image = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.TrivialAugmentWide()])
    per_pil_image = v2.Compose([per_image, v2.PILToTensor()])
    ours = BatchAugment(crop_padding=4, flip=True, policy="trivial")

    pipelines = {
        "batched (ours)": lambda x: [ours(batch) for batch in x.split(args.batch_size)],
        "torchvision tensor": lambda x: [per_image(image) for image in x],
        "torchvision PIL": lambda _: [per_pil_image(image) for image in pil_images],
    }
    for fn in pipelines.values():  # warm-up: first-call dispatch and allocations
        fn(data[: args.batch_size])
    rates = {name: [] for name in pipelines}
    for _ in range(rounds):
        for name, fn in pipelines.items():
            rates[name].append(images_per_second(fn, data, num_images))

    median = {name: statistics.median(r) for name, r in rates.items()}
    print(f"torch {torch.__version__}, 1 thread, {rounds} rounds of {num_images} images, median images/s per core:")
    for name, rate in median.items():
        print(f"  {name:20s} {rate:10,.0f}")
    ours_rate = median["batched (ours)"]
    for name in ("torchvision tensor", "torchvision PIL"):
        print(f"  ours / {name}: {ours_rate / median[name]:.1f}x")
    torch.set_num_threads(threads)


def cifar_as_jpegs(root: Path, count: int) -> None:
    """``count`` CIFAR-10 images (test set first, then training images) upscaled to 64x64, as ``root/<class>/*.jpg``."""
    from vit.data.cifar10 import CIFAR10_CLASSES, read_cifar10

    data_dir = os.environ.get("VIT_DATA_DIR") or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    images, labels = read_cifar10(data_dir, train=False, verify=False)
    if count > len(labels):
        train_images, train_labels = read_cifar10(data_dir, train=True, verify=False)
        images, labels = torch.cat([images, train_images]), torch.cat([labels, train_labels])
    for name in CIFAR10_CLASSES:
        (root / name).mkdir(parents=True)
    for i, (image, label) in enumerate(zip(images[:count], labels[:count].tolist())):
        picture = PIL.Image.fromarray(image.permute(1, 2, 0).numpy()).resize((64, 64), PIL.Image.Resampling.BICUBIC)
        picture.save(root / CIFAR10_CLASSES[label] / f"{i:05}.jpg", quality=90)


def folder_case(args) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from vit.data.folder import ImageFolderDataModule

    count, rounds = (512, 2) if args.quick else (min(args.folder_images, 60000), args.folder_rounds)
    size, padding, batch_size = 64, 8, args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cifar64"
        start = time.perf_counter()
        cifar_as_jpegs(root, count)
        print(f"\nfolder: {count} CIFAR-10 images as 64x64 JPEGs in {root} ({time.perf_counter() - start:.1f} s to "
              f"write), batch {batch_size}, {os.cpu_count()} CPUs, torch {torch.get_num_threads()} threads")

        def make():
            # the cache outside the tree: torchvision's ImageFolder would take root/.vit_cache for a class
            return ImageFolderDataModule(str(root), image_size=size, val_fraction=0, batch_size=batch_size,
                                         crop_padding=padding, cache_dir=str(Path(tmp) / "cache"))

        start = time.perf_counter()
        dm = make()
        dm.prepare_data()
        dm.setup("fit")
        caching = time.perf_counter() - start
        start = time.perf_counter()
        dm = make()
        dm.prepare_data()
        dm.setup("fit")
        opening = time.perf_counter() - start
        assert not dm.cache_built
        print(f"  first run: cached {count} images in {caching:.2f} s = {count / caching:,.0f} images/s "
              f"({dm.decode_workers} decoding processes); a later run opens it in {opening:.2f} s")

        def ours():
            for images, labels in dm.train_dataloader():
                dm.normalize(dm.augment(images))

        transform = v2.Compose([
            v2.Resize(size, interpolation=v2.InterpolationMode.BICUBIC), v2.CenterCrop(size),
            v2.RandomCrop(size, padding=padding), v2.RandomHorizontalFlip(), v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(dm.mean, dm.std),
        ])
        loader = DataLoader(ImageFolder(str(root), transform=transform), batch_size=batch_size, shuffle=True,
                            drop_last=True, num_workers=2, persistent_workers=True)

        def theirs():
            for images, labels in loader:
                pass

        pipelines = {"cached + batched (ours)": ours, "torchvision ImageFolder": theirs}
        times = {name: [] for name in pipelines}
        for fn in pipelines.values():
            fn()  # warm-up epoch
        for _ in range(rounds):
            for name, fn in pipelines.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) for name, t in times.items()}
        images_per_epoch = count // batch_size * batch_size
        print(f"  median epoch of {images_per_epoch} images over {rounds} rounds:")
        for name, seconds in median.items():
            print(f"    {name:24s} {seconds:8.3f} s  {images_per_epoch / seconds:10,.0f} images/s")
        print(f"  ours / torchvision: {median['torchvision ImageFolder'] / median['cached + batched (ours)']:.1f}x "
              "faster per epoch")
        del loader  # its worker processes, before the folder goes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["all", "augment", "folder"], default="all")
    parser.add_argument("--quick", action="store_true", help="few images and rounds: checks that it runs")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--folder-images", type=int, default=5000, help="images in the folder case (at most 60,000)")
    parser.add_argument("--folder-rounds", type=int, default=3, help="timed epochs of each pipeline in the folder case")
    args = parser.parse_args()
    if args.case in ("all", "augment"):
        augment_case(args)
    if args.case in ("all", "folder"):
        folder_case(args)


if __name__ == "__main__":
    main()
