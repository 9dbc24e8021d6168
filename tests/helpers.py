"""What many tests share: where things are, fake CIFAR-10 data, a tiny ViT and a training checkpoint of one (as
vit.ViTClassifier writes them). Plain constants and functions only; the fixtures built on them are in conftest.py."""

import hashlib
import shutil
from pathlib import Path

import numpy as np
import torch

import vit
from vit.data import cifar10 as vdata
from vit.weights import CONFIG_KEY

REPO = Path(__file__).resolve().parents[1]
REAL_CIFAR10 = REPO.parent / "shared" / "data" / "cifar-10-batches-bin"
SMOKE = str(REPO / "configs" / "smoke.yaml")


def data_args(data_dir) -> list[str]:
    """Command-line options that point a run at fake data (see the ``fake_data`` fixture)."""
    return ["--data.data_dir", str(data_dir), "--data.verify", "false", "--data.val_size", "64"]


def write_fake_cifar10(root: Path, per_file: int = 64, seed: int = 0) -> Path:
    """Small random data in the official binary layout: 5 training files and a test file of ``per_file`` records."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = np.arange(per_file, dtype=np.uint8) % 10
        pixels = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
        np.concatenate([labels[:, None], pixels], axis=1).tofile(folder / name)
    return root


def copy_with_official_sums(fake_data: Path, root: Path, monkeypatch) -> Path:
    """A copy of the fake data in ``root`` whose MD5 sums the reader takes as the official ones (so that a
    verified read passes until a file changes); returns the copy's ``cifar-10-batches-bin`` folder."""
    folder = root / "cifar-10-batches-bin"
    shutil.copytree(fake_data / "cifar-10-batches-bin", folder)
    names = vdata.LAYOUTS[folder.name]["train"]
    sums = {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in names}
    monkeypatch.setitem(vdata.LAYOUTS[folder.name], "train", sums)
    return folder


def tiny_vit(**overrides) -> vit.ViT:
    """A 2-block, 32-wide ViT on 16x16 images with 4x4 patches (16 tokens + CLS) and 5 classes."""
    config = dict(image_size=16, patch_size=4, num_classes=5, dim=32, depth=2, heads=2)
    return vit.ViT(**{**config, **overrides})


def write_training_checkpoint(path, model: vit.ViT | None = None, **extra) -> Path:
    """A training checkpoint of ``model`` (default: ``tiny_vit()``) at ``path``: its weights under ``model.``
    and its config, as ``ViTClassifier`` saves them; ``extra`` adds or replaces top-level entries."""
    model = model if model is not None else tiny_vit()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    torch.save({"state_dict": state, CONFIG_KEY: model.config.to_dict(), **extra}, path)
    return path
