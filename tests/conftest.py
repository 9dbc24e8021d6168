from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_CIFAR10 = REPO.parent / "shared" / "data" / "cifar-10-batches-bin"
SMOKE = str(REPO / "configs" / "smoke.yaml")


def data_args(data_dir) -> list[str]:
    """Command-line options that point a run at fake data (see ``fake_data``)."""
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


@pytest.fixture(scope="session")
def fake_data(tmp_path_factory) -> Path:
    """A data_dir holding fake CIFAR-10 (320 training and 64 test images); read it with verify=False."""
    return write_fake_cifar10(tmp_path_factory.mktemp("fake_cifar"))


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A temporary working directory: the runs/ folder of a command lands here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
