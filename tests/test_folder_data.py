"""ImageFolderDataModule: layouts, the decoded cache, statistics, batches and every kind of bad data."""

import io
import json
import os
import pickle
import struct
import warnings
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vit.data.cifar10 import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, normalize
from vit.data.datamodule import CIFAR10DataModule
from vit.data.folder import ImageFolderDataModule, SkippedFilesWarning
from vit.data.images import decode_image, open_rgb, resize_crop


def noise(size=(20, 30), seed=0) -> Image.Image:
    """Random RGB pixels, ``size = (W, H)``."""
    w, h = size
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def save(image: Image.Image, path, **kwargs):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)
    return path


def make_tree(root, classes=("cat", "dog", "emu"), per_class=4, seed=0):
    """``root/<class>/`` with ``per_class`` 20x30 or 30x20 images each, JPEG and PNG (some .JPG, one nested)."""
    for c, name in enumerate(classes):
        for i in range(per_class):
            suffix = (".jpg", ".PNG", ".JPG", ".png")[i % 4]
            folder = root / name / ("sub" if i == 1 and c == 0 else "")
            save(noise((20, 30) if i % 2 else (30, 20), seed=seed * 1000 + c * 100 + i), folder / f"{i}{suffix}")
    return root


def module(root, **kwargs):
    return ImageFolderDataModule(str(root), **{"image_size": 16, "batch_size": 2, "num_workers": 1, **kwargs})


def set_up(dm, stage="fit"):
    """``dm.setup(stage)``, returning the SkippedFilesWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup(stage)
    return [w for w in caught if issubclass(w.category, SkippedFilesWarning)]


def sizes(dm):
    return {name: len(split) for name, split in dm.splits.items()}


# ---- layouts and splits ------------------------------------------------------------------------------------------


def test_classes_are_known_before_any_decoding(tmp_path):
    dm = module(make_tree(tmp_path / "data"), image_size=24)
    assert dm.classes == ["cat", "dog", "emu"] and dm.num_classes == 3 and dm.image_size == 24
    assert dm.mean is None and not dm.cache_path.exists()
    assert dm.augment.crop_padding == 3  # image_size // 8


def test_class_layout_seeded_split_is_stratified_and_reproducible(tmp_path):
    root = make_tree(tmp_path / "data", per_class=10)
    dm = module(root, val_fraction=0.2, seed=1)
    assert not set_up(dm)
    assert sizes(dm) == {"train": 24, "val": 6}  # 2 of each class's 10 (nested images count) held out
    assert torch.bincount(dm.splits["val"].labels).tolist() == [2, 2, 2]
    again, other = module(root, val_fraction=0.2, seed=1), module(root, val_fraction=0.2, seed=2)
    again.setup("fit")
    other.setup("fit")
    assert np.array_equal(again.splits["val"].rows, dm.splits["val"].rows)
    assert not np.array_equal(other.splits["val"].rows, dm.splits["val"].rows)
    assert not set(dm.splits["val"].rows) & set(dm.splits["train"].rows)
    with pytest.raises(ValueError, match="no test split"):
        dm.setup("test")


def test_train_val_test_layout(tmp_path):
    root = tmp_path / "data"
    make_tree(root / "train", classes=("a", "b"), per_class=4)
    make_tree(root / "val", classes=("a", "b"), per_class=2, seed=1)
    make_tree(root / "test", classes=("b",), per_class=3, seed=2)  # a split need not hold every class
    dm = module(root, val_fraction=0.5)  # ignored: val/ is given
    assert dm.classes == ["a", "b"]
    dm.setup("fit")
    dm.setup("test")
    assert sizes(dm) == {"train": 8, "val": 4, "test": 3}
    assert dm.splits["test"].labels.tolist() == [1, 1, 1]
    images, labels = next(iter(dm.test_dataloader()))
    assert images.shape == (3, 3, 16, 16) and images.dtype == torch.uint8 and labels.dtype == torch.int64


def test_a_val_or_test_class_missing_from_train_is_named(tmp_path):
    root = tmp_path / "data"
    make_tree(root / "train", classes=("a", "b"), per_class=1)
    make_tree(root / "val", classes=("a", "c"), per_class=1)
    with pytest.raises(ValueError, match=r"val class 'c' \(.*val/c\) not in train"):
        module(root)


def test_train_beside_class_folders_is_ambiguous(tmp_path):
    make_tree(tmp_path / "data", classes=("train", "car"), per_class=1)
    with pytest.raises(ValueError, match="holds train/ and also car: ambiguous"):
        module(tmp_path / "data")


# ---- the cache ---------------------------------------------------------------------------------------------------


def test_cache_is_built_once_then_reused(tmp_path):
    root = make_tree(tmp_path / "data")
    first = module(root)
    first.prepare_data()
    first.setup("fit")
    assert first.cache_built and first.cache_path.parent == root / ".vit_cache"
    stamp = first.cache_path.stat().st_mtime_ns
    second = module(root)
    second.prepare_data()
    second.setup("fit")
    assert not second.cache_built and first.cache_path.stat().st_mtime_ns == stamp
    assert second.classes == first.classes  # the cache folder is hidden: never a class
    assert torch.equal(second.splits["train"][0][0], first.splits["train"][0][0])


@pytest.mark.parametrize("change", ["rewrite a file", "add a file", "remove a file", "image_size", "resize_size"])
def test_cache_is_rebuilt_when_files_or_sizes_change(tmp_path, change):
    root = make_tree(tmp_path / "data")
    module(root).setup("fit")
    settings = {}
    if change == "rewrite a file":
        path = save(noise(seed=99), root / "dog" / "0.jpg")
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    elif change == "add a file":
        save(noise(seed=98), root / "dog" / "new.png")
    elif change == "remove a file":
        (root / "dog" / "0.jpg").unlink()
    else:
        settings = {"image_size": 8} if change == "image_size" else {"resize_size": 20}
    dm = module(root, **settings)
    dm.setup("fit")
    assert dm.cache_built
    expected = {"add a file": 13, "remove a file": 11}.get(change, 12)
    assert len(dm.splits["train"]) + len(dm.splits["val"]) == expected
    assert dm.splits["train"][0][0].shape == (3, dm.image_size, dm.image_size)
    again = module(root, **settings)
    again.setup("fit")
    assert not again.cache_built


def test_cache_dir_and_pool_decoding(tmp_path):
    root = make_tree(tmp_path / "data", per_class=12)  # 36 images: enough for a pool of 2
    pooled = module(root, num_workers=2, cache_dir=str(tmp_path / "cache"))
    pooled.setup("fit")
    assert pooled.cache_path.is_relative_to(tmp_path / "cache") and not (root / ".vit_cache").exists()
    inline = module(root, num_workers=1)
    inline.setup("fit")
    assert np.array_equal(np.load(pooled.cache_path), np.load(inline.cache_path))
    assert pooled.mean == inline.mean


def test_mean_and_std_are_the_training_images(tmp_path):
    dm = module(make_tree(tmp_path / "data", per_class=6), val_fraction=0.3)
    dm.setup("fit")
    train = np.load(dm.cache_path)[dm.splits["train"].rows].astype(np.float64) / 255
    np.testing.assert_allclose(dm.mean, train.mean(axis=(0, 2, 3)), rtol=0, atol=1e-9)
    np.testing.assert_allclose(dm.std, train.std(axis=(0, 2, 3)), rtol=0, atol=1e-9)


def test_batches_are_uint8_then_augmented_and_normalised(tmp_path):
    dm = module(make_tree(tmp_path / "data", per_class=6), batch_size=4)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.uint8
    assert labels.shape == (4,) and labels.dtype == torch.int64
    x, y = dm.on_after_batch_transfer((images, labels), 0)  # no trainer: evaluation, normalisation only
    mean, std = torch.tensor(dm.mean).view(1, 3, 1, 1), torch.tensor(dm.std).view(1, 3, 1, 1)
    torch.testing.assert_close(x, (images.float() / 255 - mean) / std)
    assert torch.equal(y, labels)
    dm.trainer = SimpleNamespace(training=True)
    torch.manual_seed(0)
    x, _ = dm.on_after_batch_transfer((images, labels), 0)  # crop (padding 2) and flip first
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and not torch.allclose(x, (images / 255 - mean) / std)
    dataset = dm.splits["train"]
    assert len(pickle.dumps(dataset)) < 4096  # loader processes reopen the memory map rather than copy it
    batch_images, batch_labels = dataset.__getitems__([2, 0])
    assert torch.equal(batch_images[1], dataset[0][0]) and batch_labels.tolist() == [dataset[2][1], dataset[0][1]]


def test_cifar10_module_has_the_same_interface_and_numbers(fake_data):
    dm = CIFAR10DataModule(data_dir=str(fake_data), verify=False, val_size=64)
    assert dm.classes == list(CIFAR10_CLASSES) and dm.num_classes == 10 and dm.image_size == 32
    assert dm.mean == CIFAR10_MEAN and dm.std == CIFAR10_STD
    dm.setup("fit")
    images, labels = next(iter(dm.val_dataloader()))
    assert torch.equal(dm.on_after_batch_transfer((images, labels), 0)[0], normalize(images))


# ---- decoding ----------------------------------------------------------------------------------------------------


def test_decoding_modes_orientation_and_depth(tmp_path):
    root = tmp_path / "data"
    half = np.zeros((30, 20, 3), dtype=np.uint8)
    half[:15] = (255, 0, 0)  # red top half of a 20-wide, 30-tall photo...
    half[15:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # ...stored sideways: shown rotated 90 degrees clockwise
    palette = Image.new("P", (20, 30), 1)
    palette.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    files = {
        "rotated.jpg": (Image.fromarray(half), {"exif": exif, "quality": 95}),
        "grey.png": (Image.new("L", (20, 30), 77), {}),
        "alpha.png": (Image.new("RGBA", (20, 30), (10, 20, 30, 0)), {}),
        "palette.png": (palette, {"transparency": 0}),
        "cmyk.jpg": (Image.new("CMYK", (20, 30), (0, 255, 255, 0)), {"quality": 95}),
        "deep.png": (Image.fromarray(np.full((30, 20), 32896, dtype=np.uint16)), {}),  # 16-bit grey, 128 at 8
        "tiff.tif": (noise(), {}),
        "webp.webp": (noise(), {"quality": 95}),
    }
    for name, (image, kwargs) in files.items():
        save(image, root / "a" / name, **kwargs)
        save(noise(), root / "b" / (name.split(".")[0] + ".png"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning from PIL or about skipped files
        rotated = decode_image(root / "a" / "rotated.jpg")
        assert rotated.shape == (3, 20, 30)
        assert rotated[0, :, 17:].float().mean() > 200 and rotated[2, :, :13].float().mean() > 200
        assert decode_image(root / "a" / "grey.png").unique().tolist() == [77]
        assert decode_image(root / "a" / "alpha.png")[:, 0, 0].tolist() == [10, 20, 30]
        assert decode_image(root / "a" / "palette.png")[:, 0, 0].tolist() == [10, 200, 30]
        red = decode_image(root / "a" / "cmyk.jpg").float().mean(dim=(1, 2))
        assert red[0] > 200 and red[1] < 60 and red[2] < 60
        assert decode_image(root / "a" / "deep.png").unique().tolist() == [128]
        dm = module(root, val_fraction=0)
        dm.setup("fit")
    assert sizes(dm) == {"train": 16, "val": 0}


def test_resize_crop_is_shorter_side_then_centre_crop():
    image = Image.fromarray(np.arange(40 * 80, dtype=np.uint8).reshape(40, 80) % 251).convert("RGB")
    assert resize_crop(image, 16).shape == (3, 16, 16)
    from torchvision.transforms import v2

    expected = np.asarray(v2.CenterCrop(16)(v2.Resize(20, interpolation=v2.InterpolationMode.BICUBIC)(image)))
    difference = np.abs(resize_crop(image, 16, 20).astype(int) - expected.transpose(2, 0, 1))
    assert difference.mean() < 2  # the same geometry; one resampling of the box instead of resize then crop
    assert open_rgb(io.BytesIO(save_bytes(Image.new("RGB", (1, 1), (5, 6, 7)), "PNG"))).size == (1, 1)


def save_bytes(image, fmt, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


# ---- bad data ----------------------------------------------------------------------------------------------------


def png_header(width, height) -> bytes:
    """A PNG that declares ``width x height`` pixels and holds none: a decompression bomb's header."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def scramble(data: bytes) -> bytes:
    """The file with a stretch of its middle inverted (a PNG's data then fails its checksum)."""
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]


def unreadable(root, monkeypatch):
    path = save(noise(), root / "a" / "locked.png")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads files whatever their permissions: refuse this one as the kernel would
        import vit.data.images as images

        def open_image(file, *args, **kwargs):
            if str(file) == str(path):
                raise PermissionError(13, "Permission denied", str(file))
            return Image.open(file, *args, **kwargs)
        monkeypatch.setattr(images, "Image", SimpleNamespace(**{**vars(Image), "open": open_image}))


def clear(root, monkeypatch=None):
    for path in sorted(root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()


BAD_DATA = {  # case: (make it inside a good tree, outcome, file or message named)
    "corrupt": (lambda r: (r / "a" / "broken.png").write_bytes(scramble(save_bytes(noise((64, 64)), "PNG"))),
                "skipped", "corrupt or truncated"),
    "truncated jpeg": (lambda r: (r / "a" / "cut.jpg").write_bytes(save_bytes(noise((64, 64)), "JPEG")[:900]),
                       "skipped", "corrupt or truncated"),
    "truncated png": (lambda r: (r / "a" / "cut.png").write_bytes(save_bytes(noise((64, 64)), "PNG")[:3000]),
                      "skipped", "corrupt or truncated"),
    "text named .jpg": (lambda r: (r / "a" / "fake.jpg").write_text("hello"), "skipped", "not an image"),
    "non-image file": (lambda r: (r / "a" / "notes.txt").write_text("labels"), "skipped", "not an image"),
    ".DS_Store": (lambda r: (r / "a" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1"), "skipped", "hidden"),
    "empty file": (lambda r: (r / "a" / "empty.png").write_bytes(b""), "skipped", "empty"),
    "dangling link": (lambda r: (r / "a" / "gone.jpg").symlink_to(r / "nowhere.jpg"), "skipped", "unreadable"),
    "unreadable": (unreadable, "skipped", "unreadable"),
    "decompression bomb": (lambda r: (r / "a" / "bomb.png").write_bytes(png_header(20000, 20000)),
                           "skipped", "too large"),
    "image outside a class": (lambda r: save(noise(), r / "stray.jpg"), "skipped", "outside a class folder"),
    "1x1 image": (lambda r: save(Image.new("RGB", (1, 1), (9, 9, 9)), r / "a" / "dot.png"), "decoded", None),
    "extreme aspect": (lambda r: save(Image.new("RGB", (3000, 2), (9, 9, 9)), r / "a" / "line.png"), "decoded", None),
    "empty root": (clear, ValueError, "no class folders in"),
    "images but no class folder": (lambda r: (clear(r), save(noise(), r / "x.jpg")), ValueError,
                                   "holds 1 image files directly"),
    "class folder without images": (lambda r: (r / "c" / "deep").mkdir(parents=True) or
                                    (r / "c" / "deep" / "notes.txt").write_text("-"),
                                    ValueError, "class folder '.*/c' holds no image files; skipped 1 file"),
    "class with only broken images": (lambda r: [(r / "b" / p.name).write_bytes(b"junk") for p in (r / "b").iterdir()],
                                      ValueError, "no training image of class 'b'"),
    "missing root": (lambda r: (clear(r), r.rmdir()), FileNotFoundError, "image folder '.*' does not exist"),
}


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_data(tmp_path, case, monkeypatch):
    make, outcome, named = BAD_DATA[case]
    root = make_tree(tmp_path / "data", classes=("a", "b"), per_class=3)
    make(root, monkeypatch) if make in (unreadable, clear) else make(root)
    if isinstance(outcome, type):
        with pytest.raises(outcome, match=named):
            dm = module(root, batch_size=1)
            dm.prepare_data()
            set_up(dm)
        return
    dm = module(root, batch_size=1, val_fraction=0)
    dm.prepare_data()
    caught = set_up(dm)
    kept = len(dm.splits["train"])
    if outcome == "decoded":
        assert kept == 7 and not caught
        return
    assert kept == 6, "only the bad file is left out"
    assert len(caught) == 1, "one summary warning"
    message = str(caught[0].message)
    assert named in message and "skipped 1 file" in message
    good = {"0.jpg", "sub", "2.JPG"}
    bad = {p for p in (root / "a").iterdir() if p.name not in good}
    bad |= {root / "stray.jpg"} if case == "image outside a class" else set()
    assert any(str(p) in message for p in bad)
    again = module(root, batch_size=1, val_fraction=0)  # a later run warns again (from the scan and the manifest)
    assert len(set_up(again)) == 1 and not again.cache_built
    assert len(set_up(again, "validate")) == 0  # one warning per module, however many stages


def test_many_skipped_files_are_one_warning_and_all_in_the_manifest(tmp_path):
    root = make_tree(tmp_path / "data", classes=("a", "b"), per_class=2)
    for i in range(25):
        (root / "a" / f"junk{i:02}.jpg").write_bytes(b"junk")
    dm = module(root, batch_size=1)
    caught = set_up(dm)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "skipped 25 files (25 not an image)" in message and "junk19.jpg" in message and "5 more" in message
    assert "the 25 that failed to decode" in message and str(dm.manifest_path) in message
    assert len(json.loads(dm.manifest_path.read_text())["skipped"]) == 25


def test_cache_folder_problems_are_named_before_any_decoding(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "data", classes=("a", "b"), per_class=1)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="cannot write the image cache in '.*file/data-.*'.*pass cache_dir="):
        module(root, cache_dir=str(tmp_path / "file")).setup()
    monkeypatch.setattr("shutil.disk_usage", lambda path: SimpleNamespace(free=1000))
    with pytest.raises(ValueError, match="the image cache needs 0.00 GiB but '.*' has 0.00 GiB free"):
        module(root).setup()


def test_a_killed_build_leaves_nothing_behind(tmp_path):
    root = make_tree(tmp_path / "data", classes=("a", "b"), per_class=1)
    dm = module(root)
    from vit.data.folder import _build_tag

    host = _build_tag().rsplit("-", 1)[0]
    folder = dm.cache_path.parent
    folder.mkdir(parents=True)
    dead = 2**22 + 12345  # above the usual pid_max: no such process
    orphans = [folder / f"{dm.cache_path.stem}.{host}-{dead}.tmp.npy",
               folder / f"{dm.cache_path.stem}.stats.{host}-{dead}.tmp.npy"]
    elsewhere = folder / f"{dm.cache_path.stem}.otherhost-{dead}.tmp.npy"  # another machine's build: not ours
    for path in [*orphans, elsewhere]:
        path.write_bytes(b"half")
    dm.setup("fit")
    assert not any(path.exists() for path in orphans) and elsewhere.exists()
    assert sorted(p.name for p in folder.iterdir() if ".tmp." not in p.name) == [
        f"{dm.cache_path.stem}.json", f"{dm.cache_path.stem}.npy", f"{dm.cache_path.stem}.stats.npy"]
