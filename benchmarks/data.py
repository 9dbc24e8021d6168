"""Training-augmentation throughput per CPU core: our batched pipeline against torchvision's per-image one.

All three pipelines do the same work, random crop (zero padding 4), horizontal flip, TrivialAugment-Wide, on
32x32 RGB uint8 CIFAR-sized images, with ``torch.set_num_threads(1)``:

* ``batched``: ``vit.data.augment.BatchAugment(policy="trivial")`` on a (256, 3, 32, 32) uint8 tensor;
* ``torchvision tensor``: ``transforms.v2`` Compose(RandomCrop, RandomHorizontalFlip, TrivialAugmentWide) called
  on each (3, 32, 32) uint8 tensor;
* ``torchvision PIL``: the same Compose plus ``PILToTensor`` on each PIL image, as a DataLoader worker would.

The pipelines run interleaved in one process for several rounds; the script prints the median images/s of each
and the ratio of ours to each torchvision one. Run: ``python benchmarks/data.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import PIL.Image
import torch
from torchvision.transforms import v2

from vit.data.augment import BatchAugment


def images_per_second(fn, images, num_images: int) -> float:
    start = time.perf_counter()
    fn(images)
    return num_images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few images and rounds: checks that it runs")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    rounds, batches = (2, 2) if args.quick else (args.rounds, 16)
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


if __name__ == "__main__":
    main()
