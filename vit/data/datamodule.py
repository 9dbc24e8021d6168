"""The CIFAR-10 LightningDataModule: images in memory as uint8 tensors, augmented per batch on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vit.data.augment import BatchAugment
from vit.data.cifar10 import CIFAR10_CLASSES, default_data_dir, download_cifar10, find_cifar10, normalize, read_cifar10


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


class CIFAR10DataModule(L.LightningDataModule):
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
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if eval_batch_size is not None and eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be positive, got {eval_batch_size}")
        if val_size < 0:
            raise ValueError(f"val_size must be >= 0, got {val_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = load in the main process), got {num_workers}")
        self.save_hyperparameters()
        self.data_dir = Path(data_dir if data_dir is not None else default_data_dir()).expanduser()
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.val_size = val_size
        self.augment = BatchAugment(crop_padding=crop_padding, flip=flip, policy=policy, num_ops=num_ops,
                                    magnitude=magnitude, erasing=erasing)
        self.num_workers = num_workers
        self.splits: dict[str, _InMemory] = {}

    @property
    def num_classes(self) -> int:
        return len(CIFAR10_CLASSES)

    def prepare_data(self) -> None:
        if find_cifar10(self.data_dir) is None and self.hparams.download:
            download_cifar10(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", "validate", None) and "train" not in self.splits:
            images, labels = read_cifar10(self.data_dir, train=True, verify=self.hparams.verify)
            if self.val_size >= len(labels):
                raise ValueError(f"val_size {self.val_size} must be smaller than the {len(labels)} training images")
            cut = len(labels) - self.val_size
            world = self.trainer.world_size if self.trainer is not None else 1
            if stage in ("fit", None) and cut < self.batch_size * world:
                raise ValueError(
                    f"val_size {self.val_size} leaves {cut} training images, fewer than one batch of "
                    f"{self.batch_size}{f' on each of {world} devices' if world > 1 else ''}: no training step "
                    "would run; lower val_size or batch_size"
                )
            self.splits["train"] = _InMemory(images[:cut], labels[:cut])
            self.splits["val"] = _InMemory(images[cut:], labels[cut:])
        if stage in ("test", "predict", None) and "test" not in self.splits:
            self.splits["test"] = _InMemory(*read_cifar10(self.data_dir, train=False, verify=self.hparams.verify))

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
        return normalize(images), labels
