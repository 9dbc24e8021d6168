"""CIFAR-100: small fake files in the official python layout (no real copy here), read fine or coarse, checked,
split, normalised, and a smoke fit through the command line."""

import hashlib
import inspect
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import SMOKE
from vit.data import cifar100
from vit.data.cifar100 import CIFAR100DataModule, read_cifar100, read_cifar100_classes
from vit.data.datamodule import CIFAR10DataModule
from vit.train.cli import main
from vit.weights.checkpoint import DATA_KEY

FINE = [f"fine_{i:02d}" for i in range(100)]
COARSE = [f"coarse_{i:02d}" for i in range(20)]
TRAIN, TEST = 320, 64


class _Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2's ``str`` (``SHORT_BINSTRING``/``BINSTRING``), as the official files hold their keys,
    names and array data; read back with ``encoding="latin1"`` they are ``str``, as torchvision reads them."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_python2_str(self, obj: bytes) -> None:
        size = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([size]) if size < 256 else pickle.BINSTRING + struct.pack("<i", size)
        self.write(head + obj)
        self.memoize(obj)

    dispatch[bytes] = save_python2_str


def _dump(path: Path, content: dict) -> None:
    with open(path, "wb") as f:
        _Python2Pickler(f, protocol=2).dump(content)  # arrays by numpy's _reconstruct, as the official files


def _py2(names: list[str]) -> list[bytes]:
    return [name.encode() for name in names]


def write_fake_cifar100(root: Path, seed: int = 0) -> Path:
    """``root/cifar-100-python/{train,test,meta}`` as the official pickles hold them: ``data`` uint8 (N, 3072)
    (R, G, B planes, each row-major), ``fine_labels`` and ``coarse_labels`` lists, the label names in ``meta``."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, n in (("train", TRAIN), ("test", TEST)):
        fine = [(3 * i) % 100 for i in range(n)]
        _dump(folder / name, {
            b"filenames": _py2([f"image_{i}.png" for i in range(n)]), b"batch_label": f"{name} batch 1 of 1".encode(),
            b"fine_labels": fine, b"coarse_labels": [label // 5 for label in fine],
            b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        })
    _dump(folder / "meta", {b"fine_label_names": _py2(FINE), b"coarse_label_names": _py2(COARSE)})
    return root


@pytest.fixture(scope="module")
def fake100(tmp_path_factory) -> Path:
    """A data_dir holding fake CIFAR-100 (320 training and 64 test images); read it with verify=False."""
    return write_fake_cifar100(tmp_path_factory.mktemp("fake_cifar100"))


def test_fine_and_coarse_labels_and_names(fake100):
    images, fine = read_cifar100(fake100, train=True, verify=False)
    assert images.shape == (TRAIN, 3, 32, 32) and images.dtype == torch.uint8
    assert fine.dtype == torch.int64 and fine[:4].tolist() == [0, 3, 6, 9] and fine.max() == 99
    _, coarse = read_cifar100(fake100, train=True, labels="coarse", verify=False)
    assert torch.equal(coarse, fine // 5) and coarse.max() == 19
    test_images, test_labels = read_cifar100(fake100 / "cifar-100-python", train=False, verify=False)
    assert test_images.shape == (TEST, 3, 32, 32) and test_labels.shape == (TEST,)
    with open(fake100 / "cifar-100-python" / "test", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"]
    # R plane, then G, then B, each row-major
    assert test_images[1, 0, 0, 1] == raw[1, 1] and test_images[1, 1, 0, 0] == raw[1, 1024]
    assert test_images[1, 2, 31, 31] == raw[1, 3071]
    assert read_cifar100_classes(fake100, verify=False) == FINE
    assert read_cifar100_classes(fake100, "coarse", verify=False) == COARSE


def test_official_sums_are_torchvisions():
    from torchvision.datasets import CIFAR100

    assert cifar100.MD5S == {**dict(CIFAR100.train_list), **dict(CIFAR100.test_list), "meta": CIFAR100.meta["md5"]}


def test_corrupt_file_is_named(fake100, tmp_path, monkeypatch):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in cifar100.MD5S:
        (folder / name).write_bytes((fake100 / "cifar-100-python" / name).read_bytes())
        monkeypatch.setitem(cifar100.MD5S, name, hashlib.md5((folder / name).read_bytes()).hexdigest())
    assert read_cifar100(tmp_path)[0].shape == (TRAIN, 3, 32, 32) and read_cifar100_classes(tmp_path) == FINE
    original = (folder / "train").read_bytes()
    raw = bytearray(original)
    raw[-5000] ^= 0xFF  # a pixel: the file still unpickles
    (folder / "train").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=re.escape(f"{str(folder / 'train')!r} is corrupt")):
        read_cifar100(tmp_path)
    assert read_cifar100(tmp_path, verify=False)[0].shape == (TRAIN, 3, 32, 32)
    (folder / "train").write_bytes(original)
    (folder / "meta").write_bytes((folder / "meta").read_bytes()[:-10])
    with pytest.raises(ValueError, match="meta' is corrupt"):
        CIFAR100DataModule(data_dir=str(tmp_path), val_size=64).setup("fit")


def test_missing_data_says_where_it_looked(tmp_path):
    dm = CIFAR100DataModule(data_dir=str(tmp_path), download=False)
    dm.prepare_data()
    assert dm.num_classes == 100  # known before the data is there: the model is built from it
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert str(tmp_path / "cifar-100-python") in message and "{train, meta}" in message and "VIT_DATA_DIR" in message
    (tmp_path / "cifar-100-python").mkdir()
    (tmp_path / "cifar-100-python" / "train").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="CIFAR-100 file '.*test' is missing"):
        dm.setup("test")


def test_failed_download_fails_fast_with_instructions(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR100

    monkeypatch.setattr(CIFAR100, "url", "http://127.0.0.1:9/cifar-100-python.tar.gz")  # nothing listens there
    with pytest.raises(FileNotFoundError, match="CIFAR-100 not found .* and the download failed"):
        CIFAR100DataModule(data_dir=str(tmp_path), download=True).prepare_data()
    with pytest.raises(FileNotFoundError, match="point --data.data_dir at '.*' to download there"):
        CIFAR100DataModule(data_dir=str(tmp_path / "cifar-100-python"), download=True).prepare_data()


def test_a_foreign_pickle_is_refused(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    with open(folder / "train", "wb") as f:
        pickle.dump({"data": Path("x")}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load pathlib"):
        read_cifar100(tmp_path, verify=False)


@pytest.mark.parametrize("labels, classes", [("fine", FINE), ("coarse", COARSE)])
def test_splits_and_normalised_batches(fake100, labels, classes):
    dm = CIFAR100DataModule(data_dir=str(fake100), labels=labels, verify=False, val_size=64, batch_size=32)
    assert dm.num_classes == len(classes) and dm.image_size == 32
    dm.setup("fit")
    dm.setup("test")
    assert dm.classes == classes
    assert len(dm.splits["train"]) == TRAIN - 64 and len(dm.splits["val"]) == 64 and len(dm.splits["test"]) == TEST
    images, labels_ = next(iter(dm.val_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (64, 3, 32, 32) and labels_.shape == (64,)
    all_images, all_labels = read_cifar100(fake100, labels=labels, verify=False)
    assert torch.equal(images, all_images[-64:]) and torch.equal(labels_, all_labels[-64:])  # last val_size, in order
    normalized, _ = dm.on_after_batch_transfer((images, labels_), 0)
    expected = (images.float() / 255 - torch.tensor(dm.mean).view(1, 3, 1, 1)) / torch.tensor(dm.std).view(1, 3, 1, 1)
    assert normalized.dtype == torch.float32
    torch.testing.assert_close(normalized, expected)
    with pytest.raises(ValueError, match="val_size 320 must be smaller than the 320 training images"):
        CIFAR100DataModule(data_dir=str(fake100), verify=False, val_size=320).setup("fit")


def test_every_option_is_described_in_the_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--data.help", "vit.data.cifar100.CIFAR100DataModule"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    blocks = {b.split()[0]: b for b in re.split(r"\n(?=  --)", text) if b.startswith("  --data.")}
    names = {"labels", *inspect.signature(CIFAR10DataModule).parameters}  # its own, and the CIFAR-10 module's
    assert set(blocks) == {f"--data.{name}" for name in names} and "--data.labels {fine,coarse}" in text
    for option, block in blocks.items():  # words between the option (with its metavar or choices) and "(type:"
        description = re.sub(r"^\s*--\S+( [A-Z_]+| \{[^}]*\})?", "", block).split("(type:")[0]
        assert re.search(r"[a-z]{3}", description), option


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="labels must be 'fine' or 'coarse'"):
        CIFAR100DataModule(labels="superclass")
    with pytest.raises(ValueError, match="val_size must be >= 0"):
        CIFAR100DataModule(val_size=-1)


# the coarse run is shorter (2 steps): only the model's 20 outputs and the names differ
@pytest.mark.parametrize("labels, classes, steps, extra", [
    ("fine", FINE, 8, []),
    pytest.param("coarse", COARSE, 2, ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"],
                 marks=pytest.mark.slow),
])
def test_smoke_fit_through_the_command_line(fake100, workdir, labels, classes, steps, extra):
    cli = main(["fit", "--config", SMOKE, "--data", "vit.data.cifar100.CIFAR100DataModule",
                "--data.data_dir", str(fake100), "--data.verify", "false", "--data.val_size", "64",
                "--data.labels", labels, "--trainer.enable_progress_bar", "false", *extra])
    assert isinstance(cli.datamodule, CIFAR100DataModule) and cli.trainer.global_step == steps  # 8: 2 epochs x 4
    assert cli.model.model.config.num_classes == len(classes)
    assert cli.model.model.head.out_features == len(classes)
    ckpt = torch.load(next((workdir / "runs").rglob("last.ckpt")), weights_only=True, map_location="cpu")
    assert ckpt[DATA_KEY]["classes"] == classes and ckpt[DATA_KEY]["mean"] == pytest.approx(cifar100.CIFAR100_MEAN)
