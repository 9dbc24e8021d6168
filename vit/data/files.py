"""Finding image files: one scan for every tool and dataset, so that they all take and skip the same files."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# What PIL decodes and a folder is searched for, compared without case (.JPG, .Png).
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


@dataclass
class Scan:
    """The image files a scan found, in order, and the files it skipped with the reason for each."""

    images: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def summary(self, shown: int = 3) -> str | None:
        """One line counting the skipped files by reason and naming the first few, or None if none was skipped."""
        if not self.skipped:
            return None
        counts = Counter(reason for _, reason in self.skipped)
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
        names = ", ".join(str(path) for path, _ in self.skipped[:shown])
        more = f", ... ({len(self.skipped) - shown} more)" if len(self.skipped) > shown else ""
        return f"skipped {len(self.skipped)} file{'s' * (len(self.skipped) > 1)} ({reasons}): {names}{more}"


def is_image_name(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def scan_images(paths: Iterable[str | os.PathLike]) -> Scan:
    """Image files: each file as given, and every image file inside each folder (recursively, sorted).

    Inside folders, hidden files and folders (names starting with ``.``, e.g. ``.DS_Store``, ``.git``), files
    whose suffix is not an image's (``notes.txt``) and empty files are skipped, each with its reason. A file named
    explicitly is always taken: whoever named it meant it, and decoding it says what is wrong.
    """
    scan = Scan()
    for path in map(Path, paths):
        if not path.is_dir():
            scan.images.append(path)
            continue
        for file in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
            parts = file.relative_to(path).parts
            if any(part.startswith(".") for part in parts):
                scan.skipped.append((file, "hidden"))
            elif not is_image_name(file):
                scan.skipped.append((file, "not an image"))
            elif not file.is_file():
                scan.skipped.append((file, "unreadable"))
            elif file.stat().st_size == 0:
                scan.skipped.append((file, "empty"))
            else:
                scan.images.append(file)
    return scan
