"""Scan a source ImageFolder: classes, samples and everything that was left out, with reasons.

Class discovery and sample order follow torchvision's ``ImageFolder``: classes are the sorted
names of the root's sub-folders (symlinks followed), ``class_to_idx`` numbers them in that order,
files are matched against torchvision's extension list case-insensitively, and samples come in
``sorted(os.walk(class_dir, followlinks=True))`` order with sorted file names.

Deliberate differences, all reported rather than hidden: hidden entries (names starting with
``.``, e.g. ``.ipynb_checkpoints`` or macOS ``._x.jpg`` forks) are ignored and counted; folders
that cannot be read are listed as errors instead of being skipped silently (``os.walk`` drops
them by default); names that are not valid UTF-8 are listed as errors, shown escaped
(``caf\\xe9.png``), and left out (a key, class name and manifest are UTF-8 text read by other
tools: an escape would silently become another file name when unpacked, so the fix is a rename);
and a folder symlink inside a class folder is not followed when it leads back into the source
folder outside that class (``loop -> ..`` would repack every other class under this label) or to
a folder holding the class folder (a loop). Symlinks within the class, and to folders outside the
source (a dataset assembled from elsewhere), are followed as torchvision does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import SourceError

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


def _shown(name: str) -> str:
    """``name`` as valid UTF-8 text: bytes that are not UTF-8 escaped as ``\\xe9``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode turned bytes that are not UTF-8 into surrogates
        return False
    return True


def _within(path: str, folder: str) -> bool:
    """Whether the resolved ``path`` is ``folder`` or lies inside it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _symlink_problem(path: str, class_dir: str, root: str) -> str | None:
    """Why the folder symlink ``path`` inside the class folder ``class_dir`` is not followed, or None."""
    target = os.path.realpath(path)
    if _within(class_dir, target):
        return f"symlink loop: {_shown(os.readlink(path))} holds this class folder; not followed"
    if _within(target, root) and not _within(target, class_dir):
        return (f"symlink to {_shown(os.path.relpath(target, root))} in the source folder but outside this class "
                f"folder; not followed (its images would get this class's label)")
    return None


def _walk(top: str, scan: Scan, root: str) -> list[tuple[str, list[str]]]:
    """Like ``os.walk(top, followlinks=True)`` but reports unreadable folders, names that are not
    UTF-8, and folder symlinks leading out of the class folder ``top`` into the source folder
    ``root`` (resolved) or into a loop."""
    class_dir = os.path.realpath(top)
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
                if not _is_utf8(entry.name):
                    scan.errors.append((path, "folder name is not valid UTF-8 (shown escaped); its images "
                                                     "are left out: rename it to UTF-8"))
                    continue
                why = _symlink_problem(path, class_dir, root) if entry.is_symlink() else None
                if why:
                    scan.errors.append((path, why))
                    continue
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
            if _is_utf8(entry.name):
                scan.classes.append(entry.name)
            else:  # labels follow the classes that are kept
                scan.errors.append((entry.path, "class folder name is not valid UTF-8 (shown escaped); the "
                                                       "class is left out: rename it to UTF-8"))
        else:  # images too: a file at the root belongs to no class (as in torchvision)
            scan.ignored_root.append(entry.path)
    if not scan.classes:
        raise SourceError(
            f"no class folders in {root}: expected the ImageFolder layout root/<class>/<image>"
        )
    real_root = os.path.realpath(root)
    for label, cls in enumerate(scan.classes):
        before = len(scan.samples)
        for folder, files in _walk(os.path.join(root, cls), scan, real_root):
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.lower().endswith(IMG_EXTENSIONS) and not _is_utf8(name):
                    scan.errors.append((path, "file name is not valid UTF-8 (shown escaped); left out: "
                                                     "rename it to UTF-8"))
                elif name.lower().endswith(IMG_EXTENSIONS):
                    scan.samples.append(Sample(path, os.path.relpath(path, root), label))
                else:
                    scan.ignored_other.append(path)
        if len(scan.samples) == before:
            scan.empty_classes.append(cls)
    # Paths in errors go into the manifest: names that are not UTF-8 are shown escaped (the root
    # itself is kept as given, so the engine can make them relative to it).
    scan.errors = [(p if _is_utf8(p) else os.path.join(root, _shown(os.path.relpath(p, root))), r)
                   for p, r in scan.errors]
    if not scan.samples:
        raise SourceError(f"no images in {root} (extensions: {', '.join(IMG_EXTENSIONS)})")
    return scan
