"""CIFAR-100 from its official python files (reading, MD5 checks, download) and its LightningDataModule.

The files, MD5 helper, restricted unpickler and data folder default are CIFAR-10's (``vit.data.cifar10``); the
DataModule shares ``InMemoryDataModule`` with CIFAR-10 and image folders.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from vit.data.cifar10 import DATA_DIR_ENV, _md5, _NumpyOnly, default_data_dir, download
from vit.data.datamodule import CIFAR10DataModule


FOLDER = "cifar-100-python"
# The official files and their MD5 sums (torchvision.datasets.CIFAR100's train_list, test_list and meta).
MD5S = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
NUM_CLASSES = {"fine": 100, "coarse": 20}
# Channel statistics of the 50,000 training images on a 0-1 scale: not computed here (no copy of the data on the
# machine this was written on) but the widely published figures, e.g. mean (0.5070751592371323,
# 0.48654887331495095, 0.4409178433670343) and std (0.2673342858792401, 0.2564384629170883, 0.27615047132568404)
# in many CIFAR-100 training repositories; population std over all pixels, as CIFAR10_STD.
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def find_cifar100(data_dir: str | os.PathLike) -> Path | None:
    """The ``cifar-100-python`` folder in ``data_dir``, or ``data_dir`` itself if it is one.

    A folder counts when it holds at least one of the official files (an empty one is not a copy of the data).
    """
    data_dir = Path(data_dir).expanduser()
    if data_dir.is_file():
        raise NotADirectoryError(f"data_dir {str(data_dir)!r} is a file, not a folder: point --data.data_dir (or "
                                 f"${DATA_DIR_ENV}) at the folder holding {FOLDER}")
    for candidate in (data_dir, data_dir / FOLDER):
        if candidate.name == FOLDER and any((candidate / name).is_file() for name in MD5S):
            return candidate
    return None


def _missing_message(data_dir: Path, split: str, reason: str = "") -> str:
    return (
        f"CIFAR-100 not found in {str(data_dir)!r}{reason}. Looked for the official python layout:\n"
        f"  {data_dir / FOLDER}/{{{split}, meta}}\n"
        f"Point --data.data_dir (or ${DATA_DIR_ENV}) at a folder holding it, extract cifar-100-python.tar.gz "
        "there, or allow the download (--data.download true)."
    )


def _load(data_dir: str | os.PathLike | None, name: str, verify: bool) -> dict:
    """One official pickle (``train``, ``test`` or ``meta``), checked against its MD5 sum when ``verify``."""
    data_dir = Path(data_dir if data_dir is not None else default_data_dir()).expanduser()
    folder = find_cifar100(data_dir)
    if folder is None:
        raise FileNotFoundError(_missing_message(data_dir, "test" if name == "test" else "train"))
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-100 file {str(path)!r} is missing (expected in {str(folder)!r})")
    if verify and _md5(path) != MD5S[name]:
        raise ValueError(
            f"CIFAR-100 file {str(path)!r} is corrupt: its MD5 is not the official {MD5S[name]}. "
            "Replace it with a fresh copy of the official release."
        )
    with open(path, "rb") as f:
        content = _NumpyOnly(f, encoding="latin1").load()
    if not isinstance(content, dict):
        raise ValueError(f"{str(path)!r} is not a CIFAR-100 file: it holds a {type(content).__name__}, not a dict")
    return content


def _field(content: dict, key: str, name: str):
    if key not in content:
        raise ValueError(f"CIFAR-100 file {name!r} has no {key!r} (it has {', '.join(map(repr, content))})")
    return content[key]


def read_cifar100(
    data_dir: str | os.PathLike | None = None, train: bool = True, labels: Literal["fine", "coarse"] = "fine",
    verify: bool = True,
) -> tuple[Tensor, Tensor]:
    """Read a CIFAR-100 split: ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``, with the 100 fine or the 20
    coarse labels.

    ``verify`` checks the file against its official MD5 sum and names it if it differs.
    """
    if labels not in NUM_CLASSES:
        raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    name = "train" if train else "test"
    batch = _load(data_dir, name, verify)
    data = np.asarray(_field(batch, "data", name), dtype=np.uint8)
    targets = np.asarray(_field(batch, f"{labels}_labels", name), dtype=np.int64)
    if data.size != len(targets) * 3 * 32 * 32:
        raise ValueError(f"CIFAR-100 file {name!r} holds {data.size} pixel values for {len(targets)} labels, "
                         f"not 3 x 32 x 32 per image")
    if len(targets) and not 0 <= targets.min() <= targets.max() < NUM_CLASSES[labels]:
        raise ValueError(f"CIFAR-100 file {name!r} has {labels} labels outside 0-{NUM_CLASSES[labels] - 1}")
    return torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.from_numpy(targets)


def read_cifar100_classes(
    data_dir: str | os.PathLike | None = None, labels: Literal["fine", "coarse"] = "fine", verify: bool = True
) -> list[str]:
    """The class names from ``meta``: ``fine_label_names`` (100) or ``coarse_label_names`` (20), label order."""
    if labels not in NUM_CLASSES:
        raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    names = [str(n) for n in _field(_load(data_dir, "meta", verify), f"{labels}_label_names", "meta")]
    if len(names) != NUM_CLASSES[labels]:
        raise ValueError(f"CIFAR-100 'meta' lists {len(names)} {labels} label names, not {NUM_CLASSES[labels]}")
    return names


def download_cifar100(data_dir: Path, timeout: float = 30.0) -> None:
    """torchvision's download of the python layout, failing fast (no hanging) when there is no network."""
    from torchvision.datasets import CIFAR100

    download(CIFAR100, data_dir, (FOLDER,), FOLDER, _missing_message, timeout)


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 from local files (or torchvision's download), kept in memory as uint8 tensors: the CIFAR-10 module
    (the same arguments, augmentation and last-images validation split) over the CIFAR-100 files, normalised with
    CIFAR-100's mean and standard deviation. ``num_classes`` is known right after construction (100 or 20);
    ``classes`` (the names in ``meta``) once the data is there.

    Args:
        data_dir: folder holding cifar-100-python (or that folder itself); default $VIT_DATA_DIR or data/.
        labels: the 100 fine classes or the 20 coarse superclasses.
        **kwargs: as CIFAR10DataModule (batch_size, val_size, download, verify, augmentation, ...).
    """

    def __init__(self, data_dir: str | None = None, labels: Literal["fine", "coarse"] = "fine", **kwargs) -> None:
        if labels not in NUM_CLASSES:
            raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
        super().__init__(data_dir, **kwargs)
        self.labels = labels
        self._classes: list[str] | None = None
        self.mean, self.std = CIFAR100_MEAN, CIFAR100_STD

    @property
    def num_classes(self) -> int:
        # fixed by the labels option, so that the model can be built before the data is downloaded
        return NUM_CLASSES[self.labels]

    @property
    def classes(self) -> list[str]:
        """The class names from ``meta``, read on first use (after ``prepare_data`` has downloaded it)."""
        if self._classes is None:
            self._classes = read_cifar100_classes(self.data_dir, self.labels, verify=self.hparams.verify)
        return self._classes

    def prepare_data(self) -> None:
        if find_cifar100(self.data_dir) is None and self.hparams.download:
            download_cifar100(self.data_dir)

    def read(self, train: bool) -> tuple[Tensor, Tensor]:
        return read_cifar100(self.data_dir, train=train, labels=self.labels, verify=self.hparams.verify)

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        # the names travel with the weights (the classifier's setup reads them next): fail here if they are unreadable
        _ = self.classes
