"""The LightningDataModules' shared base (uint8 images indexed per batch, augmented per batch on the device, normalised
with the module's own mean and std) and the CIFAR-10 one; the image-folder one is in ``vit.data.folder``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vit.data.augment import BatchAugment
from vit.data.cifar10 import (
    CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, default_data_dir, download_cifar10, find_cifar10, read_cifar10,
)


class _InMemory(Dataset):
    """Images and labels held as tensors; a whole batch is one indexing operation."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        index = torch.as_tensor(indices)
        return self.images[index], self.labels[index]


def _batch_as_is(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return batch


class InMemoryDataModule(L.LightningDataModule):
    """What the image-classification DataModules share: uint8 splits indexed a whole batch at a time, their
    loaders, the batched on-device augmentation of training batches and the normalisation of every batch.

    A subclass sets ``classes``, ``image_size`` and ``augment`` in its ``__init__``, ``mean`` and ``std`` (per
    channel, 0-1 scale) once it knows them, and fills ``splits`` (``"train"``, ``"val"``, ``"test"``) with datasets
    whose ``__getitems__`` returns a whole ``(uint8 (B, 3, H, W), int64 (B,))`` batch.
    """

    classes: list[str]
    image_size: int
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    augment: BatchAugment

    def __init__(self, batch_size: int, eval_batch_size: int | None, num_workers: int) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if eval_batch_size is not None and eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be positive, got {eval_batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = load in the main process), got {num_workers}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.num_workers = num_workers
        self.splits: dict[str, Dataset] = {}
        self._statistics: dict[torch.device, tuple[tuple, Tensor, Tensor]] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def normalize(self, images: Tensor) -> Tensor:
        """uint8 images ``(B, 3, H, W)`` -> float32, scaled to 0-1 and standardised with ``mean`` and ``std``."""
        if self.mean is None or self.std is None:
            raise RuntimeError(f"{type(self).__name__}.mean/std are known after setup(); call setup() first")
        key = (self.mean, self.std)
        cached = self._statistics.get(images.device)
        if cached is None or cached[0] != key:  # made once per device: a fresh tensor per batch would be a copy
            mean = torch.tensor(self.mean, device=images.device).view(1, 3, 1, 1)
            std = torch.tensor(self.std, device=images.device).view(1, 3, 1, 1)
            cached = self._statistics[images.device] = (key, mean, std)
        _, mean, std = cached
        # (x / 255 - mean) / std in place on one new float32 copy: the same numbers, a third of the memory traffic
        return images.to(torch.float32, copy=True).div_(255).sub_(mean).div_(std)

    def split_last(self, images: Tensor, labels: Tensor, val_size: int, stage: str | None) -> None:
        """``splits["train"]`` and ``splits["val"]``: the last ``val_size`` images validate, the rest train; refused
        when that leaves less than one training batch (on every device) to a run that trains."""
        if val_size >= len(labels):
            raise ValueError(f"val_size {val_size} must be smaller than the {len(labels)} training images")
        cut = len(labels) - val_size
        world = self.trainer.world_size if self.trainer is not None else 1
        if stage in ("fit", None) and cut < self.batch_size * world:
            raise ValueError(
                f"val_size {val_size} leaves {cut} training images, fewer than one batch of "
                f"{self.batch_size}{f' on each of {world} devices' if world > 1 else ''}: no training step "
                "would run; lower val_size or batch_size"
            )
        self.splits["train"] = _InMemory(images[:cut], labels[:cut])
        self.splits["val"] = _InMemory(images[cut:], labels[cut:])

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size if split == "train" else self.eval_batch_size,
            shuffle=shuffle,
            drop_last=shuffle,  # equal-sized training steps; evaluation sees every image
            collate_fn=_batch_as_is,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def on_after_batch_transfer(self, batch: tuple[Tensor, Tensor], dataloader_idx: int) -> tuple[Tensor, Tensor]:
        images, labels = batch
        if self.trainer is not None and self.trainer.training:
            images = self.augment(images)
        return self.normalize(images), labels


class CIFAR10DataModule(InMemoryDataModule):
    """CIFAR-10 from local files (or torchvision's download), kept in memory as uint8 tensors.

    Training batches are augmented on the device they are moved to (random crop with padding, horizontal
    flip, an optional TrivialAugment/RandAugment policy, optional random erasing), then every batch is
    normalised with the CIFAR-10 mean and standard deviation. The validation split is the last ``val_size``
    training images.

    Args:
        data_dir: folder holding ``cifar-10-batches-bin`` or ``cifar-10-batches-py`` (or one of them);
            default ``$VIT_DATA_DIR`` or ``data/``.
        batch_size: training batch size per device.
        eval_batch_size: validation/test batch size (default: ``2 * batch_size``; no gradients to keep).
        val_size: images held out from the end of the training set for validation.
        download: fetch the python layout through torchvision when no local copy is found.
        verify: check each file against its official MD5 sum.
        crop_padding: zero padding of the random crop (0 disables the crop).
        flip: random horizontal flip.
        policy: extra augmentation policy applied after crop and flip.
        num_ops: RandAugment operations per image.
        magnitude: RandAugment magnitude (0-30).
        erasing: probability of zeroing a random rectangle of each training image.
        num_workers: loader processes; the data is already in memory, so 0 is usually fastest.
    """

    classes = list(CIFAR10_CLASSES)

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        val_size: int = 5000,
        download: bool = True,
        verify: bool = True,
        crop_padding: int = 4,
        flip: bool = True,
        policy: Literal["none", "trivial", "randaugment"] = "none",
        num_ops: int = 2,
        magnitude: int = 9,
        erasing: float = 0.0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, num_workers)
        if val_size < 0:
            raise ValueError(f"val_size must be >= 0, got {val_size}")
        self.augment = BatchAugment(crop_padding=crop_padding, flip=flip, policy=policy, num_ops=num_ops,
                                    magnitude=magnitude, erasing=erasing)
        self.save_hyperparameters()
        self.data_dir = Path(data_dir if data_dir is not None else default_data_dir()).expanduser()
        self.val_size = val_size
        self.image_size = 32
        self.mean, self.std = CIFAR10_MEAN, CIFAR10_STD

    def prepare_data(self) -> None:
        if find_cifar10(self.data_dir) is None and self.hparams.download:
            download_cifar10(self.data_dir)

    def read(self, train: bool) -> tuple[Tensor, Tensor]:
        """The training or test split's uint8 images and int64 labels, from the files."""
        return read_cifar10(self.data_dir, train=train, verify=self.hparams.verify)

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", "validate", None) and "train" not in self.splits:
            self.split_last(*self.read(train=True), self.val_size, stage)
        if stage in ("test", "predict", None) and "test" not in self.splits:
            self.splits["test"] = _InMemory(*self.read(train=False))
