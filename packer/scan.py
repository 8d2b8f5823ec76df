"""Scan a source ImageFolder: classes, samples and everything that was left out, with reasons.

Class discovery and sample order follow torchvision's ``ImageFolder``: classes are the sorted
names of the root's sub-folders (symlinks followed), ``class_to_idx`` numbers them in that order,
files are matched against torchvision's extension list case-insensitively, and samples come in
``sorted(os.walk(class_dir, followlinks=True))`` order with sorted file names.

Two deliberate differences, both reported rather than hidden: hidden entries (names starting
with ``.``, e.g. ``.ipynb_checkpoints`` or macOS ``._x.jpg`` forks) are ignored and counted, and
folders that cannot be read are listed as errors instead of being skipped silently (``os.walk``
drops them by default). Symlink loops are detected and reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import SourceError

__all__ = ["IMG_EXTENSIONS", "Sample", "Scan", "scan_imagefolder"]

#: torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Sample:
    """One source image: its path, its path relative to the root (the sample key) and its label."""

    path: str
    relpath: str
    label: int


@dataclass
class Scan:
    """The result of scanning a source folder."""

    root: str
    classes: list[str]
    samples: list[Sample]
    ignored_hidden: list[str] = field(default_factory=list)
    ignored_other: list[str] = field(default_factory=list)  # files without an image extension
    ignored_root: list[str] = field(default_factory=list)  # files at the root, outside every class folder
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): unreadable, loops
    empty_classes: list[str] = field(default_factory=list)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ``find_classes`` returns it."""
        return {c: i for i, c in enumerate(self.classes)}


def _walk(top: str, scan: Scan) -> list[tuple[str, list[str]]]:
    """Like ``os.walk(top, followlinks=True)`` but reports unreadable folders and symlink loops."""
    out: list[tuple[str, list[str]]] = []
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = []
    try:
        st = os.stat(top)
        stack.append((top, frozenset({(st.st_dev, st.st_ino)})))
    except OSError as e:
        scan.errors.append((top, f"cannot read folder: {e.strerror or e}"))
    while stack:
        folder, ancestors = stack.pop()
        files: list[str] = []
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            scan.errors.append((folder, f"cannot read folder: {e.strerror or e}"))
            continue
        for entry in entries:
            path = entry.path
            if entry.name.startswith("."):
                scan.ignored_hidden.append(path)
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError as e:
                scan.errors.append((path, f"cannot stat: {e.strerror or e}"))
                continue
            if is_dir:
                try:
                    st = os.stat(path)
                except OSError as e:
                    scan.errors.append((path, f"cannot stat: {e.strerror or e}"))
                    continue
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    scan.errors.append((path, "symlink loop: this folder contains itself; not followed"))
                    continue
                stack.append((path, ancestors | {ident}))
            elif entry.is_file(follow_symlinks=True):
                files.append(entry.name)
            elif entry.is_symlink():
                scan.errors.append((path, "broken symlink"))
        out.append((folder, files))
    out.sort()
    return out


def scan_imagefolder(root: str | os.PathLike[str]) -> Scan:
    """Scan ``root/<class>/**/<image>`` and return classes, samples and what was left out.

    Raises SourceError when the root is missing, not a folder, has no class folders, or holds
    no image at all.
    """
    root = os.fspath(root)
    if not os.path.exists(root):
        raise SourceError(f"source folder does not exist: {root}")
    if not os.path.isdir(root):
        raise SourceError(f"source is not a folder: {root}")
    scan = Scan(root=root, classes=[], samples=[])
    try:
        with os.scandir(root) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise SourceError(f"cannot read source folder {root}: {e.strerror or e}") from e
    for entry in entries:
        if entry.name.startswith("."):
            scan.ignored_hidden.append(entry.path)
        elif entry.is_dir(follow_symlinks=True):
            scan.classes.append(entry.name)
        else:  # images too: a file at the root belongs to no class (as in torchvision)
            scan.ignored_root.append(entry.path)
    if not scan.classes:
        raise SourceError(
            f"no class folders in {root}: expected the ImageFolder layout root/<class>/<image>"
        )
    for label, cls in enumerate(scan.classes):
        before = len(scan.samples)
        for folder, files in _walk(os.path.join(root, cls), scan):
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.lower().endswith(IMG_EXTENSIONS):
                    scan.samples.append(Sample(path, os.path.relpath(path, root), label))
                else:
                    scan.ignored_other.append(path)
        if len(scan.samples) == before:
            scan.empty_classes.append(cls)
    if not scan.samples:
        raise SourceError(f"no images in {root} (extensions: {', '.join(IMG_EXTENSIONS)})")
    return scan
