"""The HDF5 writer: ``data.h5``, written as ``data.h5.partial`` and renamed once complete (layout:
packer.layouts.hdf5).

Determinism: samples are buffered and written in blocks whose boundaries depend only on the data
(``checkpoint_samples``, default 8192, or 16 MB of payload), object modification times are off
(``track_times=False``) and the file format is pinned (``libver=("earliest", "v110")``), so
identical input gives a byte-identical file.

Resume: after every block the file is flushed (``H5Fflush``) and the block is a checkpoint. HDF5
rewrites its metadata in place, so a file killed in the middle of a later block cannot be trusted
as a whole; but payload chunks, once written whole, are never moved or rewritten. So the writer
keeps an append-only log, ``.data.h5.log``, fsynced at each checkpoint: each sample's metadata
(key, label, size, codec, payload CRC), the file address of every whole payload chunk, and the
payload bytes not yet in a whole chunk. ``resume`` reads the checkpoint's samples back from those
chunks and the log (CRC checked) and replays them into a fresh file through the same blocks, so a
resumed file is byte-identical to an uninterrupted one. The log is deleted when the file is done.
Samples with fields (version 3) log each mask or extra image as /images is logged, and their boxes.
"""



from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import sys
from typing import Any

import crc32c
import h5py
import numpy as np

from packer.description.manifest import FileEntry, file_sha256
from packer.description.placement import file_id, place_seed
from packer.fields import KINDS
from packer.fields.boxes import BOXES
from packer.files.filesystem import fsync_dir
from packer.images.codecs import CODEC_IDS, CODEC_NAMES
from packer.images.imageproc import ProcessedField, ProcessedImage
from packer.layouts.hdf5 import (
    CHUNK_BYTES,
    DATA_FILE,
    FIELDS_GROUP,
    FIELDS_LAYOUT_VERSION,
    LAYOUT_VERSION,
    LIBVER,
    field_group,
)

from .base import Writer, WriterOptions, no_room
from .hdf5log import BOX_COUNT, FIELD, SAMPLE, Checkpoints

__all__ = ["HDF5Writer"]

_META_CHUNK = 8192  # rows per chunk of the per-sample datasets
_BLOCK_BYTES = 16 << 20  # flush the buffer at this many payload bytes ...
_BLOCK_SAMPLES = 8192  # ... or at this many samples (checkpoint_samples overrides it)
_STR = h5py.string_dtype("utf-8")
_SPACE_MARGIN = 1 << 20  # free space kept for HDF5's metadata writes
_META_NAMES = ("labels", "shapes", "crc32c", "key_crc32c")


class _FieldStream:
    """One mask or extra image while writing: its flat /fields/NAME/images and per-sample rows."""

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind, self.group = name, kind, field_group(name)
        self.channels: int | None = None  # fixed by the first sample
        self.codec_ids = bytearray()  # one per sample
        self.depths = bytearray()  # one per sample
        self.pending: list[tuple[bytes, int, int, int]] = []  # payload, height, width, crc
        self.carry = bytearray()  # payload bytes not yet written (less than a chunk)
        self.written = 0  # bytes in images
        self.end = 0  # offset after the last payload added
        self.chunk_addrs: list[int] = []  # file address of each whole chunk
        self.logged_chunks = 0

    def take(self, key: str, f: ProcessedField, seed: int) -> bytes:
        """Buffer sample ``key``'s field ``f``; return its resume-log entry."""
        if f.name != self.name:
            raise ValueError(f"sample {key!r} has field {f.name!r} where the dataset has {self.name!r}")
        if self.channels is None:
            self.channels = f.channels
        if f.channels != self.channels or f.depth not in (8, 16):
            raise ValueError(f"sample {key!r}: field {f.name!r} has {f.channels} channels of {f.depth} bits, "
                             f"the dataset's earlier samples {self.channels}")
        payload = bytes(f.payload)
        crc, codec_id = crc32c.crc32c(payload, seed), CODEC_IDS[f.codec]
        self.pending.append((payload, f.height, f.width, crc))
        self.codec_ids.append(codec_id)
        self.depths.append(f.depth)
        return FIELD.pack(crc, codec_id, f.channels, f.depth, f.height, f.width, len(payload))


def _key_text(key: str) -> str:
    """``key`` as HDF5 can store it: no NUL, valid UTF-8."""
    if "\0" in key:
        key = key.replace("\0", "\ufffd")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        key = key.encode("utf-8", "replace").decode("utf-8").replace("?", "\ufffd")
    return key


_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02  # fallocate(2) modes
_RESERVE_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """Linux ``fallocate(2)``; OSError(EOPNOTSUPP) where there is none."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not available")
    if libc.fallocate(fd, mode, ctypes.c_int64(offset), ctypes.c_int64(length)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _reserve(path: str, nbytes: int) -> None:
    """Allocate ``nbytes`` of disk past the end of ``path`` without changing its size or bytes
    (``FALLOC_FL_KEEP_SIZE``): HDF5's next writes land there and cannot meet ENOSPC. ENOSPC here
    is raised before HDF5 writes anything; where the file system cannot reserve, the free-space
    check alone stands."""
    fd = os.open(path, os.O_WRONLY)
    try:
        _fallocate(fd, _KEEP_SIZE, os.fstat(fd).st_size, nbytes)
    except OSError as e:
        if e.errno not in _RESERVE_UNSUPPORTED:
            raise OSError(e.errno, f"{e.strerror} (reserving {nbytes} bytes for HDF5's next write)", path) from None
    finally:
        os.close(fd)


def _release_reserve(path: str) -> None:
    """Give back the disk reserved past the end of the finished file (its bytes are unchanged)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        _fallocate(fd, _KEEP_SIZE | _PUNCH_HOLE, os.fstat(fd).st_size, 1 << 40)
    except OSError:
        pass  # nothing reserved, or a file system without hole punching: the blocks stay allocated
    finally:
        os.close(fd)


def _le(a: np.ndarray) -> bytes:
    """Little-endian bytes of an array (what the ``crc32c`` attributes cover)."""
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


_ZERO_OFFSET_CRC = crc32c.crc32c(_le(np.zeros(1, np.uint64)))  # an /offsets holding only its first 0


def _group(f: h5py.File, path: str) -> h5py.Group:
    """A new group at ``path`` without modification times (identical input, identical bytes)."""
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    h5py.h5g.create(f.id, path.encode("utf-8"), gcpl=gcpl)
    return f[path]


def _write_chunks(images: h5py.Dataset, carry: bytearray, written: int, final: bool) -> int:
    """Append the whole chunks of ``carry`` (all of it when ``final``) to the flat ``images``,
    which holds ``written`` bytes; ``carry`` keeps the rest. Returns the bytes now written."""
    n = len(carry) if final else len(carry) // CHUNK_BYTES * CHUNK_BYTES
    if n:
        images.resize(written + n, axis=0)
        images[written:] = np.frombuffer(carry, np.uint8, n)
        del carry[:n]
    return written + n


def _note_chunks(images: h5py.Dataset, rows_written: int, addrs: list[int], path: str) -> None:
    """Append to ``addrs`` the file address of every chunk of ``images`` completed since."""
    per_chunk = images.chunks[0]
    zeros = (0,) * (images.ndim - 1)
    for c in range(len(addrs), rows_written // per_chunk):
        info = images.id.get_chunk_info_by_coord((c * per_chunk, *zeros))
        if info.byte_offset is None:
            raise OSError(f"HDF5 did not allocate chunk {c} of /{images.name.lstrip('/')} in {path}")
        addrs.append(int(info.byte_offset))


def _codec_name(ids: bytearray) -> str:
    """The codec of samples with codec ``ids``: one name, ``mixed`` or ``none`` (no samples)."""
    codecs = sorted(set(ids))
    return CODEC_NAMES[codecs[0]] if len(codecs) == 1 else ("mixed" if codecs else "none")


def _codecs_dataset(parent: h5py.Group, ids: bytearray) -> int:
    """Write ``codecs`` (one id per sample, with the id -> name map) into ``parent``; its CRC."""
    a = np.frombuffer(bytes(ids), np.uint8)
    d = parent.create_dataset("codecs", data=a, track_times=False)
    d.attrs["names"] = json.dumps({str(v): k for k, v in CODEC_IDS.items()})
    return crc32c.crc32c(_le(a))


class HDF5Writer(Checkpoints, Writer):
    """Writes ``data.h5`` into the output directory (see the module docstring for the layout)."""

    format = "hdf5"
    writes_fields = True
    resumable = True

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._block_samples = options.checkpoint_samples or _BLOCK_SAMPLES
        if self._block_samples < 1:
            raise ValueError(f"checkpoint_samples must be at least 1, not {self._block_samples}")
        self._info: dict[str, Any] = {}
        self._generation = 0
        self._f: h5py.File | None = None
        self._storage: str | None = None  # "flat" or "array", fixed by the first sample
        self._shape: tuple[int, int] = (0, 0)  # (H, W) of "array" storage
        self._codec_ids = bytearray()  # one per sample; written only when codecs are mixed
        self._count = 0  # samples added
        self._fid = ""  # the file's identity, from its first sample (packer.description.placement)
        self._written = 0  # samples whose metadata is in the file
        self._payload_written = 0  # bytes ("flat") or rows ("array") in /images
        self._payload_end = 0  # offset after the last payload added ("flat")
        self._carry = bytearray()  # "flat": payload bytes not yet written (less than a chunk)
        self._rows: list[bytes] = []  # "array": rows not yet written (less than a chunk)
        self._crcs: dict[str, int] = {}  # running CRC32C of each metadata dataset
        self._pending: list[tuple[str, int, int, int, int, int]] = []  # key, label, h, w, crc, key crc
        self._pending_payloads: list[bytes] = []
        self._pending_bytes = 0
        # resume log state
        self._chunk_addrs: list[int] = []  # file address of each whole /images chunk, this generation
        self._logged_chunks = 0
        self._logged_generation = -1
        self._unlogged: list[bytes] = []  # sample records not yet in the log
        self._log: Any = None
        self._stale: list[tuple[int, str]] = []  # earlier generation files, deleted at a later checkpoint
        self._logged_count = 0
        self._after_journal: list[str] = []  # deleted at the checkpoint after the next one
        self._delete_now: list[str] = []
        self._due = False
        # version 3 (fields): a stream per mask or extra image, and the boxes
        self._streams: list[_FieldStream] = []
        self._boxes = False
        self._box_pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._box_end = 0

    # -- file handling ---------------------------------------------------------------------------
    def _partial(self, generation: int | None = None) -> str:
        g = self._generation if generation is None else generation
        return self.path(f"{DATA_FILE}.partial{g or ''}")

    def _create(self, storage: str) -> None:
        """Open a fresh partial file with empty, extendible datasets for ``storage``."""
        self._f = h5py.File(self._partial(), "w", libver=LIBVER, track_order=False, locking=False)
        f = self._f
        opts: dict[str, Any] = {"track_times": False}
        if storage == "flat":
            f.create_dataset("images", (0,), np.uint8, chunks=(CHUNK_BYTES,), maxshape=(None,), **opts)
            d = f.create_dataset("offsets", (1,), np.uint64, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
            d[0] = 0
            self._crcs["offsets"] = _ZERO_OFFSET_CRC
        else:
            h, w = self._shape
            k = max(1, CHUNK_BYTES // (h * w * 3))
            f.create_dataset("images", (0, h, w, 3), np.uint8, chunks=(k, h, w, 3), maxshape=(None, h, w, 3), **opts)
        f.create_dataset("labels", (0,), np.int64, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
        f.create_dataset("shapes", (0, 2), np.uint32, chunks=(_META_CHUNK, 2), maxshape=(None, 2), **opts)
        f.create_dataset("crc32c", (0,), np.uint32, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
        f.create_dataset("key_crc32c", (0,), np.uint32, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
        f.create_dataset("keys", (0,), _STR, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
        for name in _META_NAMES:
            self._crcs[name] = 0
        if self._streams or self._boxes:
            self._create_fields(opts)
        self._storage = storage
        self._written = 0
        self._payload_written = 0
        self._chunk_addrs = []

    def _create_fields(self, opts: dict[str, Any]) -> None:
        """Version 3: a group per mask or extra image (flat images, offsets, shapes, crc32c), and
        the boxes datasets."""
        f = self._f
        assert f is not None
        _group(f, FIELDS_GROUP)
        for s in self._streams:
            g = _group(f, s.group)
            g.create_dataset("images", (0,), np.uint8, chunks=(CHUNK_BYTES,), maxshape=(None,), **opts)
            g.create_dataset("offsets", (1,), np.uint64, chunks=(_META_CHUNK,), maxshape=(None,), **opts)[0] = 0
            g.create_dataset("shapes", (0, 2), np.uint32, chunks=(_META_CHUNK, 2), maxshape=(None, 2), **opts)
            g.create_dataset("crc32c", (0,), np.uint32, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
            self._crcs.update({f"{s.group}/offsets": _ZERO_OFFSET_CRC, f"{s.group}/shapes": 0, f"{s.group}/crc32c": 0})
        if self._boxes:
            f.create_dataset("boxes", (0, 4), np.float32, chunks=(_META_CHUNK, 4), maxshape=(None, 4), **opts)
            f.create_dataset("box_offsets", (1,), np.uint64, chunks=(_META_CHUNK,), maxshape=(None,), **opts)[0] = 0
            f.create_dataset("box_labels", (0,), np.int32, chunks=(_META_CHUNK,), maxshape=(None,), **opts)
            self._crcs.update({"boxes": 0, "box_offsets": _ZERO_OFFSET_CRC, "box_labels": 0})

    @staticmethod
    def _append(d: h5py.Dataset, rows: np.ndarray) -> None:
        n = d.shape[0]
        d.resize(n + len(rows), axis=0)
        d[n:] = rows

    def _append_meta(self, name: str, rows: np.ndarray) -> None:
        assert self._f is not None
        self._append(self._f[name], rows)
        self._crcs[name] = crc32c.crc32c(_le(rows), self._crcs[name])

    # -- adding samples --------------------------------------------------------------------------
    def begin(self, info: dict[str, Any]) -> None:
        """Keep the manifest facts for the file's ``manifest`` attribute and ``/classes``; note the
        samples' fields (version 3)."""
        self._info = dict(info)
        fields = info.get("fields") or []
        self._streams = [_FieldStream(f["name"], f["kind"]) for f in fields if KINDS[f["kind"]].stored]
        self._boxes = any(KINDS[f["kind"]] is BOXES for f in fields)

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Buffer one sample; a full block (``checkpoint_samples`` samples or 16 MB) is written at
        once, flushed, and is a checkpoint."""
        payload = bytes(image.payload)
        raw_shape = (image.height, image.width)
        if image.codec == "raw" and len(payload) != image.height * image.width * 3:
            raise ValueError(f"raw payload of {len(payload)} bytes for a {image.height}x{image.width}x3 image ({key})")
        if self._storage is None:
            self._shape = raw_shape
            # With fields (version 3) always flat: a switch from "array" (_to_flat) rewrites /images only.
            self._create("array" if image.codec == "raw" and not (self._streams or self._boxes) else "flat")
        elif self._storage == "array" and (image.codec != "raw" or raw_shape != self._shape):
            self._to_flat()
        text = _key_text(key)
        kraw = text.encode("utf-8")
        if index == 0:
            self._fid = file_id(0, text, payload)
        seed = place_seed(self._fid, index)
        crc, kcrc = crc32c.crc32c(payload, seed), crc32c.crc32c(kraw)
        codec_id = CODEC_IDS[image.codec]
        entry = SAMPLE.pack(int(label), image.height, image.width, crc, codec_id, len(payload), len(kraw)) + kraw
        if self._streams or self._boxes:
            entry += self._add_fields(key, image, seed)
        self._codec_ids.append(codec_id)
        self._pending.append((text, int(label), image.height, image.width, crc, kcrc))
        self._pending_payloads.append(payload)
        self._pending_bytes += len(payload)
        self._unlogged.append(entry)
        self._count += 1
        if self._pending_bytes >= _BLOCK_BYTES or len(self._pending) >= self._block_samples:
            self._flush()
            self._sync_chunks()
            self._due = True

    def _add_fields(self, key: str, image: ProcessedImage, seed: int) -> bytes:
        """Buffer sample ``key``'s masks, extra images (each CRC seeded with ``seed``, its place)
        and boxes; return their resume-log entry."""
        if [f.name for f in image.fields] != [s.name for s in self._streams]:
            raise ValueError(f"sample {key!r} has the fields {[f.name for f in image.fields]}, "
                             f"the dataset {[s.name for s in self._streams]}")
        parts = [s.take(key, f, seed) for s, f in zip(self._streams, image.fields)]
        self._pending_bytes += sum(len(s.pending[-1][0]) for s in self._streams)
        if self._boxes:
            if image.boxes is None:
                raise ValueError(f"sample {key!r} has no boxes (every sample of a dataset with boxes has a list)")
            b = np.asarray(image.boxes, "<f4").reshape(-1, 4)
            lab = np.full(len(b), -1, "<i4") if image.box_labels is None else np.asarray(image.box_labels, "<i4")
            if lab.shape != (len(b),):
                raise ValueError(f"sample {key!r}: {lab.size} box labels for {len(b)} boxes")
            self._box_pending.append((b, lab))
            parts.append(BOX_COUNT.pack(len(b)) + b.tobytes() + lab.tobytes())
        return b"".join(parts)

    def _sync_chunks(self) -> None:
        """Flush HDF5's caches to the file and note the address of every new whole chunk."""
        assert self._f is not None
        self._f.flush()
        _note_chunks(self._f["images"], self._payload_written, self._chunk_addrs, self._partial())
        for s in self._streams:
            _note_chunks(self._f[f"{s.group}/images"], s.written, s.chunk_addrs, self._partial())

    def _ensure_space(self, nbytes: int) -> None:
        """Refuse to start a write HDF5 would fail for lack of space: HDF5 2.0 cannot recover from
        a failed write (closing the file fails again, and the interpreter crashes at exit), so
        room for the data plus 1 MiB of metadata is checked first and ENOSPC (or EFBIG, for a
        process file size limit) raised here instead. The room is then reserved past the end of
        the file, so another process filling the disk after the check cannot take it."""
        path = self._partial()
        err = no_room(path, nbytes, _SPACE_MARGIN)
        if err is not None:
            raise err
        _reserve(path, nbytes + _SPACE_MARGIN + CHUNK_BYTES)  # + what HDF5's caches hold unwritten

    def _flush(self, final: bool = False) -> None:
        """Write the buffered metadata, and the payload in whole chunks (all of it when ``final``)."""
        if self._f is None:
            return
        self._ensure_space(self._pending_bytes + len(self._carry) + sum(len(r) for r in self._rows)
                           + 64 * len(self._pending) + sum(len(p[0]) for p in self._pending)
                           + sum(len(s.carry) for s in self._streams) + 20 * sum(len(b) for b, _ in self._box_pending))
        if self._pending:
            keys, labels, hs, ws, crcs, kcrcs = zip(*self._pending)
            self._f["keys"].resize(self._written + len(keys), axis=0)
            self._f["keys"][self._written :] = np.array(keys, dtype=object)
            self._append_meta("labels", np.array(labels, np.int64))
            self._append_meta("shapes", np.stack([np.array(hs, np.uint32), np.array(ws, np.uint32)], axis=1))
            self._append_meta("crc32c", np.array(crcs, np.uint32))
            self._append_meta("key_crc32c", np.array(kcrcs, np.uint32))
            if self._storage == "flat":
                ends = self._payload_end + np.cumsum([len(p) for p in self._pending_payloads], dtype=np.uint64)
                self._append_meta("offsets", ends.astype(np.uint64))
                self._payload_end = int(ends[-1])
                self._carry += b"".join(self._pending_payloads)
            else:
                self._rows.extend(self._pending_payloads)
            self._written += len(keys)
            self._pending.clear()
            self._pending_payloads.clear()
            self._pending_bytes = 0
        images = self._f["images"]
        if self._storage == "flat":
            self._payload_written = _write_chunks(images, self._carry, self._payload_written, final)
        else:
            k = images.chunks[0]
            n = len(self._rows) if final else len(self._rows) // k * k
            if n:
                h, w = self._shape
                block = np.frombuffer(b"".join(self._rows[:n]), np.uint8).reshape(n, h, w, 3)
                images.resize(self._payload_written + n, axis=0)
                images[self._payload_written :] = block
                self._payload_written += n
                del self._rows[:n]
        if self._streams or self._boxes:
            self._flush_fields(final)

    def _flush_fields(self, final: bool) -> None:
        """Write the buffered fields' rows and whole chunks (all of it when ``final``), and the boxes."""
        f = self._f
        assert f is not None
        for s in self._streams:
            if s.pending:
                payloads, hs, ws, crcs = zip(*s.pending)
                ends = s.end + np.cumsum([len(p) for p in payloads], dtype=np.uint64)
                self._append_meta(f"{s.group}/offsets", ends.astype(np.uint64))
                self._append_meta(f"{s.group}/shapes", np.stack([np.array(hs, np.uint32), np.array(ws, np.uint32)], 1))
                self._append_meta(f"{s.group}/crc32c", np.array(crcs, np.uint32))
                s.end = int(ends[-1])
                s.carry += b"".join(payloads)
                s.pending.clear()
            s.written = _write_chunks(f[f"{s.group}/images"], s.carry, s.written, final)
        if self._box_pending:
            boxes = np.concatenate([b for b, _ in self._box_pending]).astype(np.float32)
            ends = self._box_end + np.cumsum([len(b) for b, _ in self._box_pending], dtype=np.uint64)
            if len(boxes):
                self._append_meta("boxes", boxes)
                self._append_meta("box_labels", np.concatenate([lab for _, lab in self._box_pending]).astype(np.int32))
            self._append_meta("box_offsets", ends.astype(np.uint64))
            self._box_end = int(ends[-1])
            self._box_pending.clear()

    def _to_flat(self) -> None:
        """Switch from "array" to "flat" storage (a raw sample of another shape, or an encoded one
        after raw ones): rewrite what was written into a fresh file, so no dead space is left."""
        self._flush(final=True)
        old = self._f
        assert old is not None
        old_path = self._partial()
        self._ensure_space(os.path.getsize(old_path))
        self._generation += 1
        self._crcs.clear()
        self._payload_end = 0
        self._create("flat")
        n = old["labels"].shape[0]
        for s in range(0, n, _META_CHUNK):
            e = min(n, s + _META_CHUNK)
            rows = old["images"][s:e]
            self._pending = list(zip(
                old["keys"].asstr()[s:e].tolist(), old["labels"][s:e].tolist(), old["shapes"][s:e, 0].tolist(),
                old["shapes"][s:e, 1].tolist(), old["crc32c"][s:e].tolist(), old["key_crc32c"][s:e].tolist(),
            ))
            self._pending_payloads = [r.tobytes() for r in rows]
            self._flush()
        old.close()
        # The last checkpoint may still point into the old file: delete it once a checkpoint in
        # the new one has been journaled (the next checkpoint() call), or at close.
        self._stale.append((self._generation - 1, old_path))

    # -- finishing -------------------------------------------------------------------------------
    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Write the rest, the attributes and ``/classes``; fsync; rename to ``data.h5``."""
        if self._f is None:
            self._create("flat")
        self._flush(final=True)
        f = self._f
        assert f is not None
        codec = _codec_name(self._codec_ids)
        if codec == "mixed":
            self._crcs["codecs"] = _codecs_dataset(f, self._codec_ids)
        for s in self._streams:
            self._close_field(f[s.group], s)
        for name, crc in self._crcs.items():
            f[name].attrs["crc32c"] = np.uint32(crc)
        classes = self._info.get("classes")
        if classes is not None:
            f.create_dataset("classes", data=np.array(list(classes), dtype=object), dtype=_STR, track_times=False)
        version = FIELDS_LAYOUT_VERSION if self._streams or self._boxes else LAYOUT_VERSION
        layout: dict[str, Any] = {
            "file": DATA_FILE,
            "layout_version": version,
            "storage": self._storage,
            "codec": codec,
            "chunk_bytes": CHUNK_BYTES,
            "checkpoint_samples": self._block_samples,
        }
        if self._storage == "array":
            layout["image_shape"] = [*self._shape, 3]
        attrs = {"packer_layout": version, "storage": self._storage, "codec": codec,
                 "num_samples": self._count, "chunk_bytes": CHUNK_BYTES, "file_id": self._fid}
        for k, v in attrs.items():
            f.attrs[k] = v
        manifest = {**self._info, "num_samples": self._count, "layout": layout}
        f.attrs["manifest"] = json.dumps(manifest, ensure_ascii=False)
        f.close()
        self._f = None
        partial, final = self._partial(), self.path(DATA_FILE)
        _release_reserve(partial)
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, final)
        self._close_log()
        fsync_dir(self.directory)
        return [FileEntry(DATA_FILE, self._count, os.path.getsize(final), file_sha256(final), id=self._fid)], layout

    def _close_field(self, g: h5py.Group, s: _FieldStream) -> None:
        """A field group's attributes, and its ``codecs`` / ``depths`` when they differ by sample."""
        codec = _codec_name(s.codec_ids)
        if codec == "mixed":
            self._crcs[f"{s.group}/codecs"] = _codecs_dataset(g, s.codec_ids)
        depths = sorted(set(s.depths))
        if len(depths) > 1:
            a = np.frombuffer(bytes(s.depths), np.uint8)
            g.create_dataset("depths", data=a, track_times=False)
            self._crcs[f"{s.group}/depths"] = crc32c.crc32c(_le(a))
        channels = s.channels if s.channels is not None else KINDS[s.kind].channels
        depth = depths[0] if len(depths) == 1 else (0 if depths else 8)
        for k, v in {"kind": s.kind, "codec": codec, "channels": channels, "depth": depth}.items():
            g.attrs[k] = v

    def abort(self) -> None:
        """Close the partial file and the log (the engine keeps the folder to resume)."""
        self._close_log()
        if self._f is not None:
            try:
                self._f.close()
            except Exception:  # noqa: BLE001 - already failing; the folder is resumed from the log
                pass
            self._f = None

    def discard(self) -> None:
        """Close without caring for the contents (the folder is deleted next). The partial file is
        emptied first: after a write failed for lack of space, HDF5 retries its metadata writes
        when the file is closed, and a file it cannot close crashes the interpreter at exit
        (HDF5 2.0). An emptied file gives those writes room."""
        self._close_log()
        if self._f is not None:
            for path in {self._partial(), *(p for _, p in self._stale)}:
                try:
                    os.truncate(path, 0)
                except OSError:
                    pass
            try:
                self._f.close()
            except Exception:  # noqa: BLE001 - already failing; the folder is removed next
                pass
            self._f = None
