"""A packed dataset's directory, opened for reading in one process and bound to one manifest.

A reader object describes the dataset it was built from. Its handles are opened later, in each
process that reads (DataLoader workers, after ``close()``), and by then the path may name another
dataset (a conversion with ``--overwrite`` swaps the folder). :class:`DatasetDir` makes every
open go through one directory descriptor whose manifest equals the reader's, so a reader reads
the dataset it opened or raises :class:`~packer.errors.DatasetChangedError`; it never mixes the
two. It also opens only regular files named directly inside the directory (no symlinks, FIFOs or
devices, no ``..``), and checks each one's size against the manifest before anything is read.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Callable

from ..description.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from ..errors import CorruptDataError, DatasetChangedError, ManifestError
from ..files.fileio import open_regular
from ..images.placeholder import placeholder_reason

__all__ = ["DatasetDir"]


class DatasetDir:
    """The directory ``root``, opened once in this process; see the module docstring.

    ``manifest`` is the reader's manifest; with ``bound`` (a dataset that has a manifest file, as
    every packer dataset has) the manifest on disk must equal it at open. ``fetch`` (a remote
    dataset's :class:`packer.storage.remote.RemoteFiles`) opens the files instead: ``root`` is then the
    node cache's copy, whose files are downloaded on first use and checked by their SHA-256.
    """

    def __init__(self, root: str, manifest: Manifest, *, bound: bool = True,
                 fetch: Callable[[str], int] | None = None) -> None:
        self.root = root
        self._fetch = fetch
        self.manifest = manifest
        self._sizes = {f.name: f.bytes for f in manifest.files}
        self._failed: dict[str, CorruptDataError] = {}  # files that failed their check: not opened again
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise DatasetChangedError(f"{root} no longer exists (deleted or moved after this reader opened it)",
                                      path=root) from None
        try:
            if bound:
                self._check_manifest()
        except BaseException:
            os.close(self.fd)
            raise

    def _changed(self, why: str) -> DatasetChangedError:
        return DatasetChangedError(
            f"{self.root} {why} after this reader opened it (replaced by another conversion, e.g. with "
            f"--overwrite?); a reader only reads the dataset it opened: open the dataset again", path=self.root,
        )

    def _check_manifest(self) -> None:
        where = os.path.join(self.root, MANIFEST_NAME)
        try:
            fd = open_regular(MANIFEST_NAME, self.fd, where=where)
        except FileNotFoundError:
            raise self._changed("lost its manifest.json") from None
        try:
            with os.fdopen(fd, "rb") as f:
                if os.fstat(f.fileno()).st_size > MAX_MANIFEST_BYTES:
                    raise self._changed("holds another manifest.json")
                raw = f.read()
        except OSError as e:
            raise CorruptDataError(f"cannot read ({e.strerror})", path=where) from None
        try:
            now = Manifest.from_json(json.loads(raw), where)
        except (ValueError, RecursionError, ManifestError):
            raise self._changed("holds another manifest.json") from None
        if now != self.manifest:
            raise self._changed("holds another dataset")

    def open(self, name: str) -> int:
        """A read-only descriptor of the payload or index file ``name``, checked as the module says.
        A local file that failed its check raises the same error again without being opened (a
        reader skipping bad samples would otherwise open it once per sample)."""
        if self._fetch is not None:
            return self._fetch(name)
        failed = self._failed.get(name)
        if failed is not None:
            raise copy.copy(failed)
        try:
            return self._open_local(name)
        except CorruptDataError as e:
            self._failed[name] = e
            raise

    def _open_local(self, name: str) -> int:
        where = os.path.join(self.root, name)
        try:
            fd = open_regular(name, self.fd, where=where)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if os.fstat(self.fd).st_nlink == 0:
                    raise self._changed("was deleted") from None
            raise CorruptDataError("file is missing", path=where) from None
        size, want = os.fstat(fd).st_size, self._sizes.get(name)
        if want is not None and size != want:
            head = os.pread(fd, 256, 0)
            os.close(fd)
            why = placeholder_reason(head)
            raise CorruptDataError(f"{where} is {why}" if why else f"file is {size} bytes, the manifest says {want}",
                                   path=where)
        return fd

    def close(self) -> None:
        """Close the directory descriptor."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
