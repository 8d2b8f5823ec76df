"""The LMDB writer (layout: packer.layouts.lmdb). Samples are
appended in write transactions of ``checkpoint_samples`` samples (default 1024) or 64 MB; when the
memory map is full the transaction is retried after doubling the map, so users never see
``MDB_MAP_FULL``.

The environment is written as ``data.mdb.partial`` (``subdir=False``, no lock file: this process
is its only user) and renamed to ``data.mdb`` once synced and closed. Every commit is a
checkpoint: the file is synced and ``--resume`` keeps the committed samples. Resuming does not
reopen the interrupted environment for writing: it reads the committed records back (CRC
checked) and replays them into a fresh environment through the same transactions, so the result
is byte-identical to an uninterrupted run (LMDB's page layout depends only on the sequence of
transactions and map sizes), and pages a killed transaction may have left are never reused.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import lmdb

from packer.description.manifest import FileEntry, file_sha256
from packer.description.placement import file_id, place_seed
from packer.description.record import pack_record, unpack_record
from packer.errors import CorruptDataError, ResumeError
from packer.files.filesystem import fsync_dir
from packer.images.imageproc import ProcessedImage
from packer.layouts.lmdb import DATA_FILE, lmdb_key

from .base import Writer, WriterOptions, no_room

__all__ = ["LMDBWriter", "CHECKPOINT_SAMPLES"]

PARTIAL = DATA_FILE + ".partial"
_RESUME_SOURCE = ".data.mdb.resume"
_INITIAL_MAP = 1 << 30
_BATCH_BYTES = 64 << 20
CHECKPOINT_SAMPLES = 1024  # default samples per transaction


class LMDBWriter(Writer):
    """Writes a packed LMDB environment into the output directory."""

    format = "lmdb"
    writes_fields = True
    resumable = True

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._batch_samples = options.checkpoint_samples or CHECKPOINT_SAMPLES
        if self._batch_samples < 1:
            raise ValueError(f"checkpoint_samples must be at least 1, not {self._batch_samples}")
        self._map_size = _INITIAL_MAP
        self._env: lmdb.Environment | None = None
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0
        self._count = 0
        self._committed = 0
        self._fid = ""  # the file's identity, from its first sample (packer.description.placement)
        self._due = False
        self._fields = False  # version 3: every record is PKS3, with its masks and extra images

    def begin(self, info: dict[str, Any]) -> None:
        """Note whether the samples have fields (a version 3 dataset: ``PKS3`` records)."""
        self._fields = bool(info.get("fields"))

    def _open(self) -> lmdb.Environment:
        if self._env is None:
            for name in (PARTIAL, PARTIAL + "-lock"):  # left by an earlier, interrupted run
                if os.path.exists(self.path(name)):
                    os.remove(self.path(name))
            self._env = _open_env(
                self.path(PARTIAL), subdir=False, lock=False, map_size=self._map_size, sync=False,
                metasync=False, meminit=True, readahead=False, max_dbs=0,
            )
        return self._env

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Queue one sample; commits every ``checkpoint_samples`` samples or 64 MB."""
        if index == 0:
            self._fid = file_id(0, key, image.payload)
        seed = place_seed(self._fid, index)
        self._put(index, pack_record(key, label, image.codec, image.height, image.width, image.payload, seed,
                                     image.fields if self._fields else None))

    def _put(self, index: int, value: bytes) -> None:
        self._open()
        self._batch.append((lmdb_key(index), value))
        self._batch_bytes += len(value)
        self._count += 1
        if len(self._batch) >= self._batch_samples or self._batch_bytes >= _BATCH_BYTES:
            self._commit()
            self._due = True

    def _commit(self) -> None:
        env = self._open()
        while self._batch:
            try:
                with env.begin(write=True) as txn:
                    for k, v in self._batch:
                        txn.put(k, v, append=True)
            except lmdb.MapFullError:
                self._map_size *= 2
                env.set_mapsize(self._map_size)
                continue
            except lmdb.Error as e:
                raise self._os_error(e, self._batch_bytes) from e
            self._committed += len(self._batch)
            self._batch.clear()
            self._batch_bytes = 0

    def _os_error(self, e: lmdb.Error, need: int) -> OSError:
        """An LMDB failure as the OSError it is: LMDB reports a disk that fills up in the middle of
        a write as EIO (a short write), so low free space makes it ENOSPC."""
        if "No space left" in str(e):
            err = OSError(errno.ENOSPC, "No space left on device", self.path(PARTIAL))
            err.bytes_needed = need or None  # type: ignore[attr-defined]  # the commit's size, for the message
            return err
        return no_room(self.path(PARTIAL), need) or OSError(errno.EIO, f"LMDB: {e}", self.path(PARTIAL))

    # -- resume ------------------------------------------------------------------------------------
    def checkpoint_due(self) -> bool:
        """True right after a commit."""
        return self._due

    def checkpoint(self) -> dict[str, Any]:
        """Sync the committed transactions to disk; the state is the committed sample count."""
        self._due = False
        if self._env is not None:
            try:
                self._env.sync(True)
            except lmdb.Error as e:
                raise self._os_error(e, 0) from e
        return {"samples": self._committed, "map_size": self._map_size}

    def resume(self, state: dict[str, Any]) -> None:
        """Replay the checkpoint's committed records from the interrupted file into a fresh one
        (see the module docstring); records after the checkpoint are dropped."""
        want = int(state.get("samples", 0))
        partial, source = self.path(PARTIAL), self.path(_RESUME_SOURCE)
        final = self.path(DATA_FILE)
        if os.path.exists(source):  # an earlier resume was interrupted: its source is still the original
            for p in (partial, final):
                if os.path.exists(p):
                    os.remove(p)
        elif os.path.exists(partial):
            os.replace(partial, source)
        elif os.path.exists(final):  # killed after close() renamed it, before the final journal
            os.replace(final, source)
        for name in (PARTIAL + "-lock", _RESUME_SOURCE + "-lock"):
            if os.path.exists(self.path(name)):
                os.remove(self.path(name))
        if want == 0:
            if os.path.exists(source):
                os.remove(source)
            return
        if not os.path.exists(source):
            raise ResumeError(f"cannot resume: {partial} is missing (run without --resume to start over)")
        try:
            old = _open_env(source, subdir=False, readonly=True, lock=False, readahead=True, max_dbs=0)
        except lmdb.Error as e:
            raise ResumeError(f"cannot resume: {partial} is unreadable ({e}); run without --resume") from None
        try:
            with old.begin(buffers=False) as txn:
                for i in range(want):
                    value = txn.get(lmdb_key(i))
                    if value is None:
                        raise ResumeError(f"cannot resume: {partial} holds fewer samples than its journal "
                                          f"({i} of {want}); run without --resume to start over")
                    try:
                        if i == 0:
                            first = unpack_record(value, verify=False)
                            self._fid = file_id(0, first.key, first.payload)
                        unpack_record(value, path=partial, sample=i, seed=place_seed(self._fid, i))
                    except CorruptDataError as e:
                        raise ResumeError(f"cannot resume: {e}; run without --resume to start over") from None
                    self._put(i, value)
        except lmdb.Error as e:
            raise ResumeError(f"cannot resume: {partial} is unreadable ({e}); run without --resume") from None
        finally:
            old.close()
        if self._committed != want or self._batch:
            raise ResumeError(f"cannot resume: replaying {want} samples did not end on a commit "
                              f"(different checkpoint_samples?); run without --resume")
        self._due = False
        self.checkpoint()
        os.remove(source)

    # -- finishing ---------------------------------------------------------------------------------
    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Commit the last batch, sync, close, rename ``data.mdb.partial`` to ``data.mdb``."""
        env = self._open()
        self._commit()
        try:
            env.sync(True)
        except lmdb.Error as e:
            raise self._os_error(e, 0) from e
        env.close()
        self._env = None
        data = self.path(DATA_FILE)
        os.replace(self.path(PARTIAL), data)
        fsync_dir(self.directory)
        entry = FileEntry(DATA_FILE, self._count, os.path.getsize(data), file_sha256(data), id=self._fid)
        return [entry], {"key_format": "%010d", "value": "packer record v2 (docs/FORMATS.md)",
                         "checkpoint_samples": self._batch_samples}

    def abort(self) -> None:
        """Close the environment without committing the pending batch."""
        if self._env is not None:
            self._env.close()
            self._env = None


def _open_env(path: str, **kwargs: Any) -> lmdb.Environment:
    """``lmdb.open(path, ...)``. py-lmdb takes only UTF-8 paths, so a file in a folder whose name
    is not UTF-8 is opened through a descriptor of that folder (Linux ``/proc/self/fd``)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        folder, name = os.path.split(path)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return lmdb.open(f"/proc/self/fd/{fd}/{name}", **kwargs)
        finally:
            os.close(fd)
    return lmdb.open(path, **kwargs)
