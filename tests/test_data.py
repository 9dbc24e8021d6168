import shutil

import pytest
import torch

from helpers import REAL_CIFAR10, copy_with_official_sums
from vit.data.cifar10 import find_cifar10, read_cifar10
from vit.data.datamodule import CIFAR10DataModule

needs_real = pytest.mark.skipif(not REAL_CIFAR10.is_dir(), reason=f"real CIFAR-10 not at {REAL_CIFAR10}")


@pytest.mark.slow
@needs_real
def test_real_cifar10_files():
    images, labels = read_cifar10(REAL_CIFAR10.parent, train=True)
    assert images.shape == (50000, 3, 32, 32) and images.dtype == torch.uint8
    assert torch.bincount(labels).tolist() == [5000] * 10
    assert labels[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    means = images.float().mean(dim=(0, 2, 3)) / 255
    torch.testing.assert_close(means, torch.tensor([0.491, 0.482, 0.447]), atol=2e-3, rtol=0)
    test_images, test_labels = read_cifar10(REAL_CIFAR10, train=False)
    assert test_images.shape == (10000, 3, 32, 32)
    assert torch.bincount(test_labels).tolist() == [1000] * 10
    assert test_labels[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]


@pytest.mark.slow
@needs_real
def test_corrupt_real_file_is_named(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    shutil.copytree(REAL_CIFAR10, folder)
    path = folder / "data_batch_3.bin"
    raw = bytearray(path.read_bytes())
    raw[12345] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="data_batch_3.bin' is corrupt"):
        read_cifar10(tmp_path, train=True)


def test_corrupt_or_truncated_file_is_named(fake_data, tmp_path, monkeypatch):
    folder = copy_with_official_sums(fake_data, tmp_path, monkeypatch)
    assert read_cifar10(tmp_path, train=True)[0].shape == (320, 3, 32, 32)
    path = folder / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="data_batch_2.bin' is corrupt"):
        read_cifar10(tmp_path, train=True)
    with pytest.raises(ValueError, match="data_batch_2.bin is 196572 bytes, not a whole number"):
        read_cifar10(tmp_path, train=True, verify=False)


def test_fake_data_layout_is_decoded(fake_data):
    images, labels = read_cifar10(fake_data, train=False, verify=False)
    raw = (fake_data / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    assert labels[1] == raw[3073]
    # R plane, then G, then B, each row-major
    assert images[0, 0, 0, 1] == raw[2] and images[0, 1, 0, 0] == raw[1 + 1024] and images[0, 2, 31, 31] == raw[3072]


def test_missing_data_says_where_it_looked(tmp_path):
    dm = CIFAR10DataModule(data_dir=str(tmp_path), download=False)
    dm.prepare_data()
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert str(tmp_path) in message and "data_batch_1.bin" in message and "VIT_DATA_DIR" in message


def test_failed_download_fails_fast_with_instructions(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    monkeypatch.setattr(CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # nothing listens there
    with pytest.raises(FileNotFoundError, match="download failed"):
        CIFAR10DataModule(data_dir=str(tmp_path), download=True).prepare_data()


def test_splits_and_batches(fake_data):
    dm = CIFAR10DataModule(data_dir=str(fake_data), verify=False, val_size=64, batch_size=32)
    dm.setup("fit")
    dm.setup("test")
    assert len(dm.splits["train"]) == 256 and len(dm.splits["val"]) == 64 and len(dm.splits["test"]) == 64
    images, labels = next(iter(dm.val_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (64, 3, 32, 32) and labels.shape == (64,)
    all_train = read_cifar10(fake_data, verify=False)[0]
    assert torch.equal(images, all_train[-64:])  # the last val_size training images, in order
    normalized, _ = dm.on_after_batch_transfer((images, labels), 0)
    assert normalized.dtype == torch.float32 and abs(normalized.mean()) < 1


def test_val_size_must_leave_training_images(fake_data):
    with pytest.raises(ValueError, match="val_size 320 must be smaller than the 320 training images"):
        CIFAR10DataModule(data_dir=str(fake_data), verify=False, val_size=320).setup("fit")


def test_an_empty_layout_folder_is_not_data_and_is_not_downloaded_into(tmp_path, monkeypatch):
    (tmp_path / "cifar-10-batches-bin").mkdir()
    assert find_cifar10(tmp_path) is None and find_cifar10(tmp_path / "cifar-10-batches-bin") is None
    # a download unpacks cifar-10-batches-py, which inside a folder named for a layout would never be found
    with pytest.raises(FileNotFoundError, match="point --data.data_dir at '.*' to download there"):
        CIFAR10DataModule(data_dir=str(tmp_path / "cifar-10-batches-bin"), download=True).prepare_data()


def test_data_dir_expands_the_home_folder(fake_data, monkeypatch):
    monkeypatch.setenv("HOME", str(fake_data.parent))
    dm = CIFAR10DataModule(data_dir=f"~/{fake_data.name}", verify=False, val_size=64)
    dm.setup("fit")
    assert dm.data_dir == fake_data and len(dm.splits["train"]) == 256
