"""Where an engine conversion's parts and result live: a local (or shared) folder, or object
storage reached by URL (``s3://``, ``gs://``, ... through fsspec, as every other URL in packer).

A :class:`Store` names files by paths relative to its root and offers only what the parts and
their merge need: put a finished local file (moved, so the worker's disk is freed at once), copy
one of its files to another name (a hard link on a local disk, a server-side copy in a bucket:
no byte passes through the driver), read and write small files, list sizes, remove a folder.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import dataclass, field
from typing import Any

from ..files.filesystem import is_url

__all__ = ["Store", "parent_and_name"]


def parent_and_name(dst: str) -> tuple[str, str]:
    """``dst`` (a local path or a URL) split into its folder and its last name."""
    if is_url(dst):
        parent, _, name = dst.rstrip("/").rpartition("/")
        return parent, name
    parent, name = os.path.split(os.path.abspath(os.path.expanduser(dst)).rstrip(os.sep) or os.sep)
    return parent, name


@dataclass(frozen=True)
class Store:
    """The folder ``root`` (a local path or a URL) with the fsspec ``storage_options`` that reach
    it; plain data, sent to the engine's tasks, which open their own connections."""

    root: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        """Whether the root is a URL (object storage) rather than a local path."""
        return is_url(self.root)

    def where(self, name: str) -> str:
        """The full path or URL of the file or folder ``name`` (relative to the root)."""
        if self.remote:
            return f"{self.root.rstrip('/')}/{name}" if name else self.root.rstrip("/")
        return os.path.join(self.root, *name.split("/")) if name else self.root

    def _fs(self) -> tuple[Any, str]:
        from ..storage.remote import Remote

        return Remote(self.root, dict(self.storage_options)).filesystem()

    def _at(self, name: str) -> tuple[Any, str]:
        fs, path = self._fs()
        return fs, posixpath.join(path, name) if name else path

    def _call(self, name: str, fn: Any, *args: Any) -> Any:
        from ..storage.remote import call

        return call(self.where(name), fn, *args)

    def put(self, local: str, name: str) -> None:
        """Move the finished local file ``local`` to ``name``: renamed (or copied, then removed)
        on a local root, uploaded, then removed, on a URL root. The local file is gone after."""
        if not self.remote:
            dest = self.where(name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.move(local, dest)
            return
        fs, path = self._at(name)
        self._call(name, fs.put_file, local, path)
        os.remove(local)

    def copy(self, src: str, dst: str, size: int) -> None:
        """Give the file ``src`` a second name ``dst`` (a hard link where the local file system
        allows, else a copy; a server-side copy on a URL root), after checking it holds ``size``
        bytes (CorruptDataError naming it otherwise)."""
        from ..errors import CorruptDataError

        got = self.size(src)
        if got != size:
            raise CorruptDataError(f"{self.where(src)} holds {got} bytes, its part's manifest says {size}; "
                                   f"nothing was merged", path=self.where(src))
        if self.remote:
            fs, path = self._fs()
            self._call(dst, fs.copy, posixpath.join(path, src), posixpath.join(path, dst))
            return
        a, b = self.where(src), self.where(dst)
        os.makedirs(os.path.dirname(b), exist_ok=True)
        try:
            os.link(a, b)
        except OSError:
            shutil.copyfile(a, b)

    def size(self, name: str) -> int:
        """The size of the file ``name`` in bytes."""
        if not self.remote:
            return os.path.getsize(self.where(name))
        fs, path = self._at(name)
        return int(self._call(name, fs.size, path))

    def read(self, name: str) -> bytes:
        """The whole file ``name`` (a small one: a manifest, an index, a sample table)."""
        if not self.remote:
            with open(self.where(name), "rb") as f:
                return f.read()
        fs, path = self._at(name)
        return bytes(self._call(name, fs.cat_file, path))

    def get(self, name: str, local: str) -> None:
        """Copy the file ``name`` to the local path ``local``."""
        if not self.remote:
            shutil.copyfile(self.where(name), local)
            return
        fs, path = self._at(name)
        self._call(name, fs.get_file, path, local)

    def write(self, name: str, data: bytes) -> None:
        """Write the file ``name`` whole (atomically on a local root; an object is whole anyway)."""
        if not self.remote:
            from ..files.filesystem import atomic_write_bytes

            os.makedirs(os.path.dirname(self.where(name)), exist_ok=True)
            atomic_write_bytes(self.where(name), data)
            return
        fs, path = self._at(name)
        self._call(name, fs.pipe_file, path, data)

    def exists(self, name: str) -> bool:
        """Whether the file or folder ``name`` exists."""
        if not self.remote:
            return os.path.lexists(self.where(name))
        fs, path = self._at(name)
        return bool(self._call(name, fs.exists, path))

    def remove(self, name: str) -> None:
        """Remove the folder (or file) ``name`` with everything in it; nothing when it is absent."""
        if not self.remote:
            target = self.where(name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            elif os.path.lexists(target):
                os.remove(target)
            return
        fs, path = self._at(name)
        try:
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        fs.invalidate_cache()
