"""CIFAR-10 from its official files: reading, MD5 checks, download, normalisation. No Lightning here."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor


DATA_DIR_ENV = "VIT_DATA_DIR"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Channel statistics of the 50,000 training images on a 0-1 scale.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# The official files of both layouts and their MD5 sums (the binary release and torchvision's python pickles).
LAYOUTS = {
    "cifar-10-batches-bin": {
        "train": {
            "data_batch_1.bin": "5dd7e06a14cb22eb9f671a540d1b7c25",
            "data_batch_2.bin": "5ea93a67294ea407fff1d09f752e9692",
            "data_batch_3.bin": "942cd6a4bcdd0dd3c604fbe906cb4421",
            "data_batch_4.bin": "ae636b3ba5c66a11e91e8cb52e771fcb",
            "data_batch_5.bin": "53f37980c15c3d472c316c40844f3f0d",
        },
        "test": {"test_batch.bin": "803d5f7f4d78ea53de84dbe85f74fb6d"},
    },
    "cifar-10-batches-py": {
        "train": {
            "data_batch_1": "c99cafc152244af753f735de768cd75f",
            "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
            "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
            "data_batch_4": "634d18415352ddfa80567beed471001a",
            "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        },
        "test": {"test_batch": "40351d587109b95175f43aff81a1287e"},
    },
}
RECORD_BYTES = 1 + 3 * 32 * 32  # binary layout: a label byte, then the R, G and B planes, each row-major


def default_data_dir() -> str:
    """``$VIT_DATA_DIR`` if set, else ``data/``."""
    return os.environ.get(DATA_DIR_ENV, "data")


def find_cifar10(data_dir: str | os.PathLike) -> Path | None:
    """The CIFAR-10 folder (either official layout) in ``data_dir``, or ``data_dir`` itself if it is one.

    A folder counts when it holds at least one of its layout's files (an empty one is not a copy of the data).
    """
    data_dir = Path(data_dir).expanduser()
    if data_dir.is_file():
        raise NotADirectoryError(f"data_dir {str(data_dir)!r} is a file, not a folder: point --data.data_dir (or "
                                 f"${DATA_DIR_ENV}) at the folder holding cifar-10-batches-bin or cifar-10-batches-py")
    for candidate in (data_dir, *(data_dir / name for name in LAYOUTS)):
        files = LAYOUTS.get(candidate.name, {})
        if any((candidate / name).is_file() for split in files.values() for name in split):
            return candidate
    return None


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % RECORD_BYTES:
        raise ValueError(f"{path} is {raw.size} bytes, not a whole number of {RECORD_BYTES}-byte CIFAR-10 records")
    records = raw.reshape(-1, RECORD_BYTES)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0]


class _NumpyOnly(pickle.Unpickler):
    """Unpickles torchvision's CIFAR-10 batches, which hold only dicts, lists, bytes and numpy arrays."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch file")
        return super().find_class(module, name)


def _read_py(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        batch = _NumpyOnly(f, encoding="latin1").load()
    return np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(batch["labels"])


def _missing_message(data_dir: Path, split: str, reason: str = "") -> str:
    wanted = "\n".join(
        f"  {data_dir / layout}/{{{', '.join(files[split])}}}" for layout, files in LAYOUTS.items()
    )
    return (
        f"CIFAR-10 not found in {str(data_dir)!r}{reason}. Looked for either official layout:\n{wanted}\n"
        f"Point --data.data_dir (or ${DATA_DIR_ENV}) at a folder holding one of them, extract "
        "cifar-10-binary.tar.gz or cifar-10-python.tar.gz there, or allow the download (--data.download true)."
    )


def read_cifar10(
    data_dir: str | os.PathLike | None = None, train: bool = True, verify: bool = True
) -> tuple[Tensor, Tensor]:
    """Read a CIFAR-10 split: ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``.

    ``verify`` checks every file against its official MD5 sum and names the file that differs.
    """
    data_dir = Path(data_dir if data_dir is not None else default_data_dir()).expanduser()
    split = "train" if train else "test"
    folder = find_cifar10(data_dir)
    if folder is None:
        raise FileNotFoundError(_missing_message(data_dir, split))
    images, labels = [], []
    for name, md5 in LAYOUTS[folder.name][split].items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR-10 file {str(path)!r} is missing (expected in {str(folder)!r})")
        if verify and _md5(path) != md5:
            raise ValueError(
                f"CIFAR-10 file {str(path)!r} is corrupt: its MD5 is not the official {md5}. "
                "Replace it with a fresh copy of the official release."
            )
        x, y = _read_bin(path) if folder.name == "cifar-10-batches-bin" else _read_py(path)
        images.append(x)
        labels.append(y)
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels).astype(np.int64))


def download_cifar10(data_dir: Path, timeout: float = 30.0) -> None:
    """torchvision's download of the python layout, failing fast (no hanging) when there is no network."""
    from torchvision.datasets import CIFAR10

    download(CIFAR10, data_dir, tuple(LAYOUTS), "cifar-10-batches-py", _missing_message, timeout)


def download(dataset, data_dir: Path, folders: tuple[str, ...], unpacks: str,
             missing_message: Callable[[Path, str, str], str], timeout: float = 30.0) -> None:
    """torchvision's download of ``dataset`` (its class: ``url``, ``filename``, ``tgz_md5``) into ``data_dir``, where
    it unpacks to the folder ``unpacks``; failing fast (no hanging) without a network, with ``missing_message``'s
    advice. ``data_dir`` must not itself be one of the dataset's ``folders``: the archive would unpack inside it."""
    from torchvision.datasets.utils import download_and_extract_archive

    if data_dir.name in folders:
        raise FileNotFoundError(missing_message(
            data_dir.parent, "train", f" ({str(data_dir)!r} is missing or empty; a download unpacks "
            f"{unpacks}, so point --data.data_dir at {str(data_dir.parent)!r} to download there)"))
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        download_and_extract_archive(dataset.url, str(data_dir), filename=dataset.filename, md5=dataset.tgz_md5)
    except Exception as err:  # any network or archive error: report what to do instead
        raise FileNotFoundError(missing_message(data_dir, "train", f" and the download failed ({err})")) from None
    finally:
        socket.setdefaulttimeout(previous)


@functools.cache
def _statistics(device: torch.device) -> tuple[Tensor, Tensor]:
    # made once per device: normalize runs on every batch, and a fresh tensor would be a host-to-device copy
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    return mean, std


def normalize(images: Tensor) -> Tensor:
    """uint8 images ``(B, 3, H, W)`` -> float32, scaled to 0-1 and standardised with the CIFAR-10 statistics."""
    mean, std = _statistics(images.device)
    return (images.float() / 255 - mean) / std
