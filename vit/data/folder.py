"""Image-folder datasets, decoded once into a uint8 cache and then trained at memory speed like CIFAR-10.

Two layouts, torchvision ``ImageFolder``'s conventions (classes are the sorted names of the class folders, images
in folders nested inside a class folder belong to it, suffixes compared without case):

* ``root/<class>/**/*.jpg``: every image is a training image; a seeded, per-class share ``val_fraction`` of each
  class is held out for validation. There is no test split.
* ``root/train/<class>/...`` with optional ``root/val/<class>/...`` and ``root/test/<class>/...``: the classes
  are train's; without ``val/`` the validation images are a seeded share of train's, as above. A ``val`` or
  ``test`` class that train lacks is an error naming it. ``root`` is read this way whenever ``root/train`` is a
  folder, so ``root/train`` beside other folders than ``val`` and ``test`` is refused as ambiguous.

Hidden files and folders (names starting with ``.``) are never classes or images, unlike torchvision's (whose
``.ipynb_checkpoints`` becomes a class).

The first run decodes every image in a pool of ``num_workers`` processes (EXIF orientation applied; grey,
palette, RGBA, CMYK and 16-bit images converted to 8-bit RGB, alpha dropped as torchvision's loader does), resizes
its shorter side to ``resize_size`` and crops the centre ``image_size`` square (one bicubic, antialiased resampling
of the crop's box; JPEGs are first decoded at the smallest DCT scale that keeps ``resize_size``), and writes every
split into one uint8 ``(N, 3, image_size, image_size)`` ``.npy`` memory map, with the per-image channel sums and a
JSON manifest beside it, in ``root/.vit_cache/`` (or ``cache_dir``). Later runs check the file list, each file's
size and modification time and the size settings against the manifest's fingerprint and open the cache at once; any
change rebuilds it. Random crops and flips happen afterwards on whole batches on the device
(``vit.data.augment.BatchAugment``), then batches are normalised with ``mean`` and ``std``, which are computed from
the training images' cached pixels. A cache larger than memory works: batches index the memory map.

A cache of another ``image_size``/``resize_size`` is another file and stays until deleted; the temporary files of a
build killed midway are deleted by the next build. torchvision's ``ImageFolder`` on the same ``root`` would take
``.vit_cache`` for a class: pass ``cache_dir`` when both read it.

What happens to bad data (nothing is dropped silently: the skipped files are named in ONE ``SkippedFilesWarning``
per run, the first 20 in the message with a count of the rest, and every file that failed to decode is listed with
its error in the manifest):

=============================================================  ========================================================
case                                                           outcome
=============================================================  ========================================================
``root`` missing                                               ``FileNotFoundError`` naming it
``root`` empty, or without class folders (images directly in)  ``ValueError`` naming it and the expected layout
``root/train`` beside other folders than ``val``/``test``      ``ValueError`` naming them (ambiguous layout)
a ``val``/``test`` class that ``train`` lacks                  ``ValueError`` naming the class and its folder
a class folder without image files                             ``ValueError`` naming the folder (and what it skipped)
a training class whose every image failed to decode            ``ValueError`` naming the class (and the failures)
no training image at all, or fewer than one batch              ``ValueError``
cache folder not writable, or too little disk space for it     ``ValueError`` naming the folder; set ``cache_dir``
hidden file (``.DS_Store``), non-image suffix (``notes.txt``)  skipped: "hidden", "not an image"
an empty (0-byte) file, a dangling link                        skipped: "empty", "unreadable"
a file that cannot be opened (permissions)                     skipped: "unreadable"
an image file outside any class folder (``root/x.jpg``)        skipped: "outside a class folder"
not an image inside (text named ``.jpg``)                      skipped: "not an image"
corrupt or truncated image                                     skipped: "corrupt or truncated"
more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` (a bomb)       skipped: "too large (PIL.Image.MAX_IMAGE_PIXELS)"
a tiny image (1x1) or an extreme aspect ratio                  decoded: resized up/cropped like any other
=============================================================  ========================================================

Under DDP, ``prepare_data`` (one process per node) builds the cache and every rank opens it in ``setup``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import multiprocessing
import os
import re
import shutil
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from numpy.lib.format import open_memmap
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from vit.data.augment import BatchAugment
from vit.data.datamodule import InMemoryDataModule
from vit.data.files import Scan, is_image_name, scan_images
from vit.data.images import open_rgb, resize_crop

CACHE_VERSION = 1  # bump when the decoding or the cache format changes: old caches are then rebuilt
CACHE_FOLDER = ".vit_cache"  # inside root by default; hidden, so never a class
SPLITS = ("train", "val", "test")
SHOWN_SKIPPED = 20  # skipped files named in the warning; the manifest lists them all


class SkippedFilesWarning(UserWarning):
    """Files of a dataset that were left out; the message names them and says why."""


def _reason(err: BaseException) -> str:
    """The category of a decoding failure, as the skip summary counts them."""
    if isinstance(err, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return "too large (PIL.Image.MAX_IMAGE_PIXELS)"
    if isinstance(err, Image.UnidentifiedImageError):
        return "not an image"
    if isinstance(err, (PermissionError, FileNotFoundError, IsADirectoryError)):
        return "unreadable"
    return "corrupt or truncated"


def _decode_into(
    array: np.ndarray, jobs: list[tuple[int, str]], image_size: int, resize_size: int, max_pixels: int | None
) -> list[tuple[int, list[float] | None, str | None]]:
    """Decode ``(row, path)`` jobs into ``array[row]``: per row its channel sums and sums of squares, or why not."""
    Image.MAX_IMAGE_PIXELS = max_pixels  # the parent's limit, also in a process that did not inherit it
    results = []
    for row, path in jobs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PIL's per-file chatter (odd EXIF, ...); failures raise
                warnings.simplefilter("error", Image.DecompressionBombWarning)  # over the limit: skip, not decode
                pixels = resize_crop(open_rgb(path, min_size=resize_size), image_size, resize_size)
        except Exception as err:  # any failure of one file skips that file, with its reason; the run goes on
            results.append((row, None, f"{_reason(err)}\t{type(err).__name__}: {err}"))
            continue
        array[row] = pixels
        flat = pixels.reshape(3, -1).astype(np.int64)
        results.append((row, [*flat.sum(1).tolist(), *(flat * flat).sum(1).tolist()], None))
    return results


_WRITING: dict[str, np.ndarray] = {}  # per worker process: the cache file it writes into, opened once


def _decode_chunk(cache: str, jobs, image_size, resize_size, max_pixels):
    if cache not in _WRITING:
        _WRITING.clear()
        _WRITING[cache] = np.load(cache, mmap_mode="r+")
    return _decode_into(_WRITING[cache], jobs, image_size, resize_size, max_pixels)


# ---- the cache --------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What a scan found: the files to cache (in row order), their labels and splits, what it skipped, and the
    fingerprint of it all (relative paths, sizes, modification times, classes, size settings)."""

    files: list[Path]
    labels: np.ndarray
    splits: np.ndarray  # index into SPLITS
    skipped: list[tuple[Path, str]]
    fingerprint: str


class _Cached(Dataset):
    """Rows of the cache's memory map and their labels; a whole batch is one fancy index into the map."""

    def __init__(self, path: Path, rows: np.ndarray, labels: np.ndarray) -> None:
        self.path, self.rows, self.labels = str(path), rows, torch.as_tensor(labels, dtype=torch.int64)
        self._images: np.ndarray | None = None

    def images(self) -> np.ndarray:
        if self._images is None:  # opened lazily: in each loader process, not pickled into it
            self._images = np.load(self.path, mmap_mode="r")
        return self._images

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(np.array(self.images()[self.rows[index]])), self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        index = np.asarray(indices)
        return torch.from_numpy(self.images()[self.rows[index]]), self.labels[torch.from_numpy(index)]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_images": None}


def _usable_cpus() -> int:
    """The CPUs this process may run on (a container's or ``taskset``'s share), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _build_tag() -> str:
    """This machine and process, as the names of a build's temporary files hold them."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', socket.gethostname())}-{os.getpid()}"


def _list_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _stratified_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of the validation share: ``round(fraction * n)`` random members of each class, leaving each
    class at least one training image. Depends only on the labels, ``fraction`` and ``seed``."""
    order = np.random.default_rng(seed).permutation(len(labels))
    val = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = order[labels[order] == label]
        take = min(int(len(members) * fraction + 0.5), len(members) - 1)
        val[members[:take]] = True
    return val


class ImageFolderDataModule(InMemoryDataModule):
    """Images in class folders (see the module docstring), decoded once into a uint8 memory-mapped cache.

    Right after construction (which lists the class folders and decodes nothing): ``classes``, ``num_classes``,
    ``image_size``, ``cache_path``. After ``setup()``: ``mean`` and ``std`` of the training images (per channel,
    0-1 scale), ``splits``, and ``cache_built`` (whether this instance wrote the cache).

    Args:
        root: ``root/<class>/...`` or ``root/{train,val,test}/<class>/...``.
        image_size: side of the square images trained on (and cached).
        resize_size: the shorter side is resized to this before the centre crop (default ``image_size``: the
            crop then keeps the whole shorter side).
        val_fraction: share of each class's training images held out for validation when there is no
            ``root/val`` (seeded by ``seed``, the same every run).
        seed: seed of that split.
        cache_dir: where the cache goes (default ``root/.vit_cache``); a folder under it is named for ``root``.
        batch_size: training batch size per device.
        eval_batch_size: validation/test batch size (default ``2 * batch_size``).
        crop_padding: zero padding of the random crop (default ``image_size // 8``, 4 at 32; 0 disables it).
        flip: random horizontal flip.
        policy: extra augmentation policy applied after crop and flip.
        num_ops: RandAugment operations per image.
        magnitude: RandAugment magnitude (0-30).
        erasing: probability of zeroing a random rectangle of each training image.
        num_workers: decoding processes while building the cache (default: one per CPU this process may use;
            0 or 1 decodes in this process).
        loader_workers: DataLoader processes; batches are slices of the cache, so 0 is usually fastest.
    """

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        resize_size: int | None = None,
        val_fraction: float = 0.1,
        seed: int = 0,
        cache_dir: str | None = None,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        crop_padding: int | None = None,
        flip: bool = True,
        policy: Literal["none", "trivial", "randaugment"] = "none",
        num_ops: int = 2,
        magnitude: int = 9,
        erasing: float = 0.0,
        num_workers: int | None = None,
        loader_workers: int = 0,
    ) -> None:
        if loader_workers < 0:
            raise ValueError(f"loader_workers must be >= 0 (0 = load in the main process), got {loader_workers}")
        super().__init__(batch_size, eval_batch_size, loader_workers)
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        if resize_size is not None and resize_size < image_size:
            raise ValueError(f"resize_size {resize_size} must be >= image_size {image_size} (the centre crop)")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        if num_workers is not None and num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (decoding processes; 0 = this process), got {num_workers}")
        self.augment = BatchAugment(
            crop_padding=image_size // 8 if crop_padding is None else crop_padding, flip=flip, policy=policy,
            num_ops=num_ops, magnitude=magnitude, erasing=erasing,
        )
        self.save_hyperparameters()
        self.root = Path(root).expanduser()
        self.image_size = image_size
        self.resize_size = resize_size or image_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.decode_workers = _usable_cpus() if num_workers is None else num_workers
        self.folders, self.classes = self._find_layout()
        name = f"images-{self.image_size}px-resize{self.resize_size}"
        if cache_dir is None:
            folder = self.root / CACHE_FOLDER
        else:
            tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
            folder = Path(cache_dir).expanduser() / f"{self.root.resolve().name}-{tag}"
        self.cache_path = folder / f"{name}.npy"
        self.cache_built = False
        self._cache: tuple[_Plan, dict] | None = None
        self._warned = False

    # ---- layout (cheap: folder listings only) ----

    def _find_layout(self) -> tuple[dict[str, Path], list[str]]:
        root = self.root
        if not root.exists():
            raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
        if not root.is_dir():
            raise ValueError(f"{str(root)!r} is a file, not a folder of class folders")
        if (root / "train").is_dir():
            others = [name for name in _list_folders(root) if name not in SPLITS]
            if others:
                raise ValueError(
                    f"{str(root)!r} holds train/ and also {', '.join(others)}: ambiguous. Either "
                    f"root/train/<class>/ (with optional root/val/, root/test/) or root/<class>/ without a "
                    f"class named 'train'")
            folders = {split: root / split for split in SPLITS if (root / split).is_dir()}
        else:
            folders = {"train": root}
        classes = _list_folders(folders["train"])
        if not classes:
            loose = [p for p in folders["train"].iterdir() if p.is_file() and is_image_name(p)]
            found = f" (it holds {len(loose)} image files directly)" if loose else ""
            raise ValueError(
                f"no class folders in {str(folders['train'])!r}{found}: expected one folder of images per class, "
                f"{str(root)}/<class>/*.jpg or {str(root)}/train/<class>/*.jpg")
        for split in ("val", "test"):
            if split in folders:
                extra = sorted(set(_list_folders(folders[split])) - set(classes))
                if extra:
                    raise ValueError(
                        f"{split} class{'es' * (len(extra) > 1)} {', '.join(map(repr, extra))} "
                        f"({', '.join(str(folders[split] / e) for e in extra)}) not in train: every class needs "
                        f"training images (train's classes: {', '.join(classes)})")
        return folders, classes

    @property
    def manifest_path(self) -> Path:
        return self.cache_path.with_suffix(".json")

    @property
    def stats_path(self) -> Path:
        return self.cache_path.with_suffix(".stats.npy")

    # ---- scan, fingerprint, cache ----

    def _plan(self) -> _Plan:
        self.folders, classes = self._find_layout()  # again: the folders may have changed since __init__
        if classes != self.classes:
            raise ValueError(f"the class folders of {str(self.root)!r} changed since this module was made: "
                             f"{self.classes} -> {classes}")
        files, labels, splits, skipped, entries = [], [], [], [], []
        for split_index, split in enumerate(SPLITS):
            folder = self.folders.get(split)
            if folder is None:
                continue
            for path in sorted(folder.iterdir()):
                if path.is_file() and is_image_name(path) and not path.name.startswith("."):
                    skipped.append((path, "outside a class folder"))
            for label, name in enumerate(self.classes):
                class_folder = folder / name
                if not class_folder.is_dir():
                    continue  # val/test need not hold every class
                scan = scan_images([class_folder])
                if not scan.images:
                    what = f"; {scan.summary()}" if scan.skipped else ""
                    raise ValueError(f"class folder {str(class_folder)!r} holds no image files{what}")
                skipped += scan.skipped
                for path in scan.images:
                    stat = path.stat()
                    entries.append((path.relative_to(self.root).as_posix(), stat.st_size, stat.st_mtime_ns))
                    files.append(path)
                labels += [label] * len(scan.images)
                splits += [split_index] * len(scan.images)
        settings = [CACHE_VERSION, self.image_size, self.resize_size, self.classes]
        fingerprint = hashlib.sha256(json.dumps([settings, entries]).encode()).hexdigest()
        return _Plan(files, np.asarray(labels, dtype=np.int64), np.asarray(splits, dtype=np.int8), skipped,
                     fingerprint)

    def _open(self, plan: _Plan) -> dict | None:
        """The manifest of a cache that matches ``plan``, or None when there is none or it is stale."""
        try:
            manifest = json.loads(self.manifest_path.read_text())
            shape = np.load(self.cache_path, mmap_mode="r").shape
            stats = np.load(self.stats_path, mmap_mode="r").shape
        except (OSError, ValueError):  # missing, unreadable or half-written: rebuild
            return None
        size = self.image_size
        if manifest.get("fingerprint") != plan.fingerprint or shape != (len(plan.files), 3, size, size):
            return None
        return manifest if stats == (len(plan.files), 6) else None

    def _ensure_cache(self) -> tuple[_Plan, dict]:
        if self._cache is None:
            plan = self._plan()
            manifest = self._open(plan)
            if manifest is None:
                self._build(plan)
                self.cache_built = True
                manifest = self._open(plan)
                if manifest is None:
                    raise RuntimeError(f"the image cache {str(self.cache_path)!r} was written but does not read back")
            self._cache = plan, manifest
        return self._cache

    def _build(self, plan: _Plan) -> None:
        n, size = len(plan.files), self.image_size
        if n == 0:
            raise ValueError(f"no image files in {str(self.root)!r}" + (f"; {Scan(skipped=plan.skipped).summary()}"
                                                                       if plan.skipped else ""))
        folder = self.cache_path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(folder).free
        except OSError as err:
            raise ValueError(f"cannot write the image cache in {str(folder)!r} ({err}); "
                             "pass cache_dir= a writable folder") from None
        needed = n * 3 * size * size + n * 6 * 8 + (1 << 20)
        if needed > free:
            raise ValueError(f"the image cache needs {needed / 2**30:.2f} GiB but {str(folder)!r} has "
                             f"{free / 2**30:.2f} GiB free; pass cache_dir= a folder with room, or a smaller "
                             "image_size")
        self.manifest_path.unlink(missing_ok=True)  # the cache is stale from here until the new manifest lands
        self._remove_orphans()
        tmp_cache, tmp_stats, tmp_manifest = (p.with_name(f"{p.stem}.{_build_tag()}.tmp{p.suffix}")
                                               for p in (self.cache_path, self.stats_path, self.manifest_path))
        try:
            try:
                array = open_memmap(tmp_cache, mode="w+", dtype=np.uint8, shape=(n, 3, size, size))
            except OSError as err:
                raise ValueError(f"cannot write the image cache {str(tmp_cache)!r} ({err}); "
                                 "pass cache_dir= a writable folder") from None
            stats = np.zeros((n, 6), dtype=np.float64)
            failed = self._decode_all(plan, array, tmp_cache, stats)
            array.flush()
            del array
            np.save(tmp_stats, stats)
            skipped = [[plan.files[row].relative_to(self.root).as_posix(), *why.split("\t", 1)]
                       for row, why in sorted(failed.items())]
            manifest = {
                "version": CACHE_VERSION, "fingerprint": plan.fingerprint, "root": str(self.root),
                "image_size": size, "resize_size": self.resize_size, "classes": self.classes,
                "images": n - len(failed), "rows": n, "skipped": skipped,
            }
            tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
            os.replace(tmp_cache, self.cache_path)
            os.replace(tmp_stats, self.stats_path)
            os.replace(tmp_manifest, self.manifest_path)  # last: it says the cache is complete
        finally:
            for path in (tmp_cache, tmp_stats, tmp_manifest):
                path.unlink(missing_ok=True)

    def _remove_orphans(self) -> None:
        """Delete the temporary files of builds of this cache, on this machine, whose process is gone (killed
        mid-build). Other machines' builds (a shared file system) are left alone."""
        pattern = re.compile(rf"{re.escape(self.cache_path.stem)}(?:\.stats)?\.([\w-]+)-(\d+)\.tmp\.(?:npy|json)")
        host, pid = _build_tag().rsplit("-", 1)
        for path in self.cache_path.parent.iterdir():
            match = pattern.fullmatch(path.name)
            if match and match[1] == host and match[2] != pid:
                try:
                    os.kill(int(match[2]), 0)
                except ProcessLookupError:
                    path.unlink(missing_ok=True)
                except OSError:  # alive under another user (PermissionError): not ours to delete
                    pass

    def _decode_all(self, plan: _Plan, array: np.ndarray, path: Path, stats: np.ndarray) -> dict[int, str]:
        """Decode every file into its row of ``array`` (the memory map at ``path``); returns the failures."""
        from tqdm import tqdm  # installed with Lightning

        n = len(plan.files)
        jobs = [(row, str(file)) for row, file in enumerate(plan.files)]
        workers = max(1, min(self.decode_workers, n // 16))  # a pool costs more than it saves on a few images
        chunk = max(1, min(64, math.ceil(n / (4 * workers))))
        chunks = [jobs[i:i + chunk] for i in range(0, n, chunk)]
        args = (self.image_size, self.resize_size, Image.MAX_IMAGE_PIXELS)
        failed: dict[int, str] = {}
        desc = f"caching {n} images of {self.root.name} at {self.image_size}px"
        with tqdm(total=n, desc=desc, unit="img", mininterval=1.0, dynamic_ncols=True) as bar:
            def collect(results):
                for row, sums, why in results:
                    if why is None:
                        stats[row] = sums
                    else:
                        failed[row] = why
                bar.update(len(results))

            if workers == 1:
                for jobs_chunk in chunks:
                    collect(_decode_into(array, jobs_chunk, *args))
            else:
                array.flush()
                with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context()) as pool:
                    futures = [pool.submit(_decode_chunk, str(path), c, *args) for c in chunks]
                    for future in concurrent.futures.as_completed(futures):
                        collect(future.result())
        return failed

    # ---- Lightning hooks ----

    def prepare_data(self) -> None:
        self._ensure_cache()  # one process per node (Lightning's prepare_data): the other ranks read it in setup

    def setup(self, stage: str | None = None) -> None:
        plan, manifest = self._ensure_cache()
        failed = {path for path, *_ in manifest["skipped"]}
        ok = np.array([f.relative_to(self.root).as_posix() not in failed for f in plan.files], dtype=bool)
        if not self._warned:
            self._warned = True
            skipped = plan.skipped + [(self.root / path, reason) for path, reason, *_ in manifest["skipped"]]
            summary = Scan(skipped=skipped).summary(shown=SHOWN_SKIPPED)
            if summary:
                failed = len(manifest["skipped"])
                full = f" (the {failed} that failed to decode, with the errors: {self.manifest_path})" if failed else ""
                rank_zero_warn(f"{self.root}: {summary}{full}", category=SkippedFilesWarning)
        if not self.splits:
            self._make_splits(plan, ok)
        world = self.trainer.world_size if self.trainer is not None else 1
        if stage in ("fit", None) and len(self.splits["train"]) < self.batch_size * world:
            raise ValueError(
                f"{len(self.splits['train'])} training images in {str(self.root)!r}, fewer than one batch of "
                f"{self.batch_size}{f' on each of {world} devices' if world > 1 else ''}: no training step "
                "would run; lower batch_size (or val_fraction)")
        if stage in ("test", "predict") and "test" not in self.splits:
            raise ValueError(f"no test split in {str(self.root)!r}: test images go in root/test/<class>/ beside "
                             "root/train/<class>/")

    def _make_splits(self, plan: _Plan, ok: np.ndarray) -> None:
        rows = np.flatnonzero(ok)
        splits = plan.splits[rows]
        train = rows[splits == 0]
        missing = sorted(set(range(self.num_classes)) - set(plan.labels[train].tolist()))
        if missing:
            names = ", ".join(repr(self.classes[i]) for i in missing)
            raise ValueError(f"no training image of class {names} in {str(self.root)!r} could be decoded "
                             f"(see {self.manifest_path})")
        if "val" in self.folders:
            val = rows[splits == 1]
        else:
            held_out = _stratified_split(plan.labels[train], self.val_fraction, self.seed)
            train, val = train[~held_out], train[held_out]
        stats = np.load(self.stats_path)[train]
        count = len(train) * self.image_size ** 2
        mean = stats[:, :3].sum(0) / count / 255
        var = stats[:, 3:].sum(0) / count / 255 ** 2 - mean ** 2
        std = np.maximum(np.sqrt(np.maximum(var, 0)), 1 / 255)  # a constant channel: no division by zero
        self.mean, self.std = tuple(mean.tolist()), tuple(std.tolist())
        self.splits["train"] = _Cached(self.cache_path, train, plan.labels[train])
        self.splits["val"] = _Cached(self.cache_path, val, plan.labels[val])
        if "test" in self.folders:
            test = rows[splits == 2]
            self.splits["test"] = _Cached(self.cache_path, test, plan.labels[test])
