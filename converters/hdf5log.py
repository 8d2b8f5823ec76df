"""The HDF5 writer's resume log (``.data.h5.log``): its records, its checkpoints and the replay
that resumes an interrupted file (the module docstring of packer.converters.hdf5 tells how)."""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

import crc32c
import numpy as np

from packer.description.placement import file_id, place_seed
from packer.errors import ResumeError
from packer.files.filesystem import fsync_dir
from packer.images.codecs import CODEC_NAMES
from packer.images.imageproc import ProcessedField, ProcessedImage
from packer.layouts.hdf5 import CHUNK_BYTES, DATA_FILE

__all__ = ["LOG_FILE", "Checkpoints"]

# The resume log: records of one type byte and a uint64 body length, then the body.
LOG_FILE = ".data.h5.log"
RESUME_SOURCE = ".data.h5.resume"
REC = struct.Struct("<cQ")
SAMPLE = struct.Struct("<qIIIBQH")  # label, height, width, payload crc, codec id, payload length, key length
CHUNKS = struct.Struct("<II")  # generation, first chunk number; then uint64 addresses
# Version 3 only: after each sample's record, per field FIELD (payload crc, codec id, channels,
# bits, height, width, payload length), then with boxes a uint32 count, the float32 boxes and int32
# labels. Records b"c" (FIELD_CHUNKS, then uint64 addresses) and b"t" (field number, then its tail).
FIELD = struct.Struct("<IBBBIIQ")
FIELD_CHUNKS = struct.Struct("<HI")  # field number, first chunk number
FIELD_NO = struct.Struct("<H")
BOX_COUNT = struct.Struct("<I")


@dataclasses.dataclass
class Extra:
    """A version 3 sample's fields (the FIELD tuples) and boxes, as its log entry holds them."""

    fields: list[tuple[int, ...]]
    boxes: np.ndarray | None = None
    box_labels: np.ndarray | None = None


@dataclasses.dataclass
class Log:
    """What a resume log holds: samples (label, height, width, crc, codec id, payload length, key,
    Extra or None), /images chunk addresses and tail, and each field's (by field number)."""

    samples: list[tuple[int, int, int, int, int, int, str, Extra | None]]
    chunks: list[int]
    tail: bytes
    field_chunks: dict[int, list[int]]
    field_tails: dict[int, bytes]


def parse_samples(body: memoryview, nfields: int, boxes: bool) -> list[tuple[Any, ...]]:
    """The sample entries of one b"M" record (version 3: with ``nfields`` fields and ``boxes``)."""
    out: list[tuple[Any, ...]] = []
    p = 0
    while p < len(body):
        label, h, w, crc, codec, plen, klen = SAMPLE.unpack_from(body, p)
        p += SAMPLE.size
        key = bytes(body[p : p + klen]).decode("utf-8")
        p += klen
        extra = None
        if nfields or boxes:
            extra = Extra([FIELD.unpack_from(body, p + k * FIELD.size) for k in range(nfields)])
            p += nfields * FIELD.size
        if boxes:
            (n,) = BOX_COUNT.unpack_from(body, p)
            p += BOX_COUNT.size
            extra.boxes = np.frombuffer(body, "<f4", 4 * n, p).reshape(n, 4)
            extra.box_labels = np.frombuffer(body, "<i4", n, p + 16 * n)
            p += 20 * n
        out.append((label, h, w, crc, codec, plen, key, extra))
    return out


def parse_log(log: bytes, generation: int, nfields: int = 0, boxes: bool = False) -> Log:
    """Samples, chunk addresses of ``generation`` and the last payload tails in a resume log."""
    out = Log([], [], b"", {}, {})
    chunk_gen = -1
    pos = 0
    try:
        while pos < len(log):
            kind, n = REC.unpack_from(log, pos)
            body = memoryview(log)[pos + REC.size : pos + REC.size + n]
            if len(body) != n:
                raise ValueError("record runs past the end")
            pos += REC.size + n
            if kind == b"M":
                out.samples += parse_samples(body, nfields, boxes)
            elif kind == b"C":
                gen, first = CHUNKS.unpack_from(body, 0)
                addrs = struct.unpack_from(f"<{(n - CHUNKS.size) // 8}Q", body, CHUNKS.size)
                if gen != chunk_gen:
                    out.chunks, chunk_gen = [], gen
                if first != len(out.chunks):
                    raise ValueError("chunk records out of order")
                out.chunks.extend(addrs)
            elif kind == b"c":
                j, first = FIELD_CHUNKS.unpack_from(body, 0)
                chunks = out.field_chunks.setdefault(j, [])
                if first != len(chunks):
                    raise ValueError("field chunk records out of order")
                chunks.extend(struct.unpack_from(f"<{(n - FIELD_CHUNKS.size) // 8}Q", body, FIELD_CHUNKS.size))
            elif kind == b"T":
                out.tail = bytes(body)
            elif kind == b"t":
                out.field_tails[FIELD_NO.unpack_from(body, 0)[0]] = bytes(body[FIELD_NO.size :])
            else:
                raise ValueError(f"unknown record {kind!r}")
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ResumeError(f"cannot resume: the HDF5 resume log is damaged ({e}); run without --resume") from None
    if chunk_gen not in (-1, generation):
        out.chunks = []
    return out


class PayloadSource:
    """The payload byte stream of an interrupted file: whole chunks at logged addresses, then the tail."""

    def __init__(self, f: Any, storage: str | None, shape: tuple[int, ...], chunks: list[int], tail: bytes) -> None:
        self.f, self.chunks, self.tail = f, chunks, tail
        if storage == "array":
            h, w = shape
            self.chunk = max(1, CHUNK_BYTES // (h * w * 3)) * h * w * 3
        else:
            self.chunk = CHUNK_BYTES
        self.pos = 0

    def take(self, n: int) -> bytes:
        out = bytearray()
        in_chunks = len(self.chunks) * self.chunk
        while n > 0:
            if self.pos < in_chunks:
                c, off = divmod(self.pos, self.chunk)
                k = min(n, self.chunk - off)
                data = os.pread(self.f.fileno(), k, self.chunks[c] + off)
            else:
                off = self.pos - in_chunks
                data = self.tail[off : off + n]
            if not data:
                raise ResumeError("cannot resume: the interrupted HDF5 file is shorter than its log says; "
                                  "run without --resume to start over")
            out += data
            self.pos += len(data)
            n -= len(data)
        return bytes(out)


class Checkpoints:
    """HDF5Writer's checkpoints and resume: it appends each block's samples, chunk addresses and
    unwritten payload to the log, and replays a checkpoint into a fresh file. A base class of
    :class:`packer.converters.hdf5.HDF5Writer`, working on that writer's state."""

    def checkpoint_due(self) -> bool:
        """True right after a block was written and flushed."""
        return self._due

    def checkpoint(self) -> dict[str, Any]:
        """Append the new samples' metadata, chunk addresses and the unwritten payload tail to the
        log; fsync the file and the log. Payload still buffered (a sample that switched the
        storage) is not part of the checkpoint."""
        self._due = False
        for path in self._delete_now:  # resume sources: a journal written after the resume exists now
            if os.path.exists(path):
                os.remove(path)
        self._delete_now, self._after_journal = self._after_journal, []
        # The journal of the previous checkpoint is durable now; files of other generations are not
        # needed by it any more.
        keep = [(g, p) for g, p in self._stale if g == self._logged_generation]
        for g, p in self._stale:
            if (g, p) not in keep and os.path.exists(p):
                os.remove(p)
        if self._log is None:
            self._log = open(self.path(LOG_FILE), "ab")  # noqa: SIM115 - closed in close()/abort()
        n_new = self._written - self._logged_count
        body = b"".join(self._unlogged[:n_new])
        records = [REC.pack(b"M", len(body)) + body] if n_new else []
        del self._unlogged[:n_new]
        self._logged_count = self._written
        if self._logged_generation != self._generation:
            self._logged_generation, self._logged_chunks = self._generation, 0
        if len(self._chunk_addrs) > self._logged_chunks or not self._logged_chunks:
            new = self._chunk_addrs[self._logged_chunks :]
            body = CHUNKS.pack(self._generation, self._logged_chunks) + struct.pack(f"<{len(new)}Q", *new)
            records.append(REC.pack(b"C", len(body)) + body)
            self._logged_chunks = len(self._chunk_addrs)
        tail = bytes(self._carry) if self._storage == "flat" else b"".join(self._rows)
        records.append(REC.pack(b"T", len(tail)) + tail)
        for j, s in enumerate(self._streams):  # version 3: each field's new chunks and tail
            if len(s.chunk_addrs) > s.logged_chunks:
                new = s.chunk_addrs[s.logged_chunks :]
                body = FIELD_CHUNKS.pack(j, s.logged_chunks) + struct.pack(f"<{len(new)}Q", *new)
                records.append(REC.pack(b"c", len(body)) + body)
                s.logged_chunks = len(s.chunk_addrs)
            records.append(REC.pack(b"t", FIELD_NO.size + len(s.carry)) + FIELD_NO.pack(j) + bytes(s.carry))
        self._log.write(b"".join(records))
        self._log.flush()
        os.fsync(self._log.fileno())
        if self._f is not None:
            fd = os.open(self._partial(), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._stale = keep
        fsync_dir(self.directory)
        return {
            "samples": self._written, "log_bytes": self._log.tell(), "generation": self._generation,
            "storage": self._storage, "shape": list(self._shape),
        }

    def resume(self, state: dict[str, Any]) -> None:
        """Replay the checkpoint's samples (from the interrupted file's chunks and the log, CRC
        checked) into a fresh file through the same blocks; everything after it is dropped.

        The interrupted file and log are renamed, not deleted, until a checkpoint after the
        resume has been journaled: a run killed while resuming resumes again from them."""
        want = int(state.get("samples", 0))
        generation = int(state.get("generation", 0))
        src_path, old_log = self.path(RESUME_SOURCE), self.path(LOG_FILE + ".resume")
        partial = self._partial(generation)
        if want and not os.path.exists(src_path):
            if os.path.exists(partial):
                os.replace(partial, src_path)
            elif os.path.exists(self.path(DATA_FILE)):  # killed after close() renamed it, before the final journal
                os.replace(self.path(DATA_FILE), src_path)
        if want and not os.path.exists(old_log) and os.path.exists(self.path(LOG_FILE)):
            os.replace(self.path(LOG_FILE), old_log)
        for name in os.listdir(self.directory):
            if name.startswith(f"{DATA_FILE}.partial") or name in (LOG_FILE, DATA_FILE):
                os.remove(self.path(name))
        if want == 0:
            for p in (src_path, old_log):
                if os.path.exists(p):
                    os.remove(p)
            return
        try:
            with open(old_log, "rb") as f:
                log = f.read(int(state["log_bytes"]))
        except (OSError, KeyError, ValueError) as e:
            raise ResumeError(f"cannot resume: the HDF5 resume log is unreadable ({e}); "
                              f"run without --resume to start over") from None
        if len(log) != int(state["log_bytes"]) or not os.path.exists(src_path):
            raise ResumeError(f"cannot resume: {partial} or its log is shorter than the journal says; "
                              f"run without --resume to start over")
        log_ = parse_log(log, generation, len(self._streams), self._boxes)
        if len(log_.samples) < want:
            raise ResumeError(f"cannot resume: the HDF5 log holds {len(log_.samples)} samples, the journal {want}; "
                              f"run without --resume to start over")
        storage, shape = state.get("storage"), tuple(state.get("shape") or (0, 0))
        with open(src_path, "rb") as src:
            reader = PayloadSource(src, storage, shape, log_.chunks, log_.tail)
            fields = [PayloadSource(src, "flat", (0, 0), log_.field_chunks.get(j, []), log_.field_tails.get(j, b""))
                      for j in range(len(self._streams))]
            for i in range(want):
                label, h, w, crc, codec_id, plen, key, extra = log_.samples[i]
                payload = reader.take(plen)
                fid = file_id(0, key, payload) if i == 0 else self._fid
                if crc32c.crc32c(payload, place_seed(fid, i)) != crc or codec_id not in CODEC_NAMES:
                    raise ResumeError(f"cannot resume: sample {i} in {partial} does not match its checksum; "
                                      f"run without --resume to start over")
                image = ProcessedImage(CODEC_NAMES[codec_id], payload, h, w)
                if extra is not None:
                    image = self._replayed(image, extra, fields, place_seed(fid, i), f"sample {i} in {partial}")
                self.add(i, key, label, image)
                if self._due:
                    self.checkpoint()
        if self._written != want:
            raise ResumeError(f"cannot resume: replaying {want} samples did not end on a block "
                              f"(different checkpoint_samples?); run without --resume to start over")
        self._after_journal = [src_path, old_log]

    def _replayed(self, image: ProcessedImage, extra: Extra, sources: list[PayloadSource], seed: int,
                  where: str) -> ProcessedImage:
        """``image`` with the fields and boxes the log holds for it, read back from ``sources``."""
        fields = []
        for s, src, (crc, codec_id, channels, depth, h, w, n) in zip(self._streams, sources, extra.fields):
            payload = src.take(n)
            if crc32c.crc32c(payload, seed) != crc or codec_id not in CODEC_NAMES:
                raise ResumeError(f"cannot resume: field {s.name!r} of {where} does not match its checksum; "
                                  f"run without --resume to start over")
            fields.append(ProcessedField(s.name, CODEC_NAMES[codec_id], payload, h, w, channels, depth))
        boxes = None if extra.boxes is None else tuple(map(tuple, extra.boxes.tolist()))
        labels = None if extra.box_labels is None else tuple(extra.box_labels.tolist())
        return dataclasses.replace(image, fields=tuple(fields), boxes=boxes, box_labels=labels)

    def forget_checkpoints(self) -> None:
        """Delete the resume log, earlier generations and resume sources (after the final journal)."""
        leftovers = [*(p for _, p in self._stale), *self._after_journal, *self._delete_now]
        for path in [*leftovers, self.path(LOG_FILE)]:
            if os.path.exists(path):
                os.remove(path)
        self._stale, self._after_journal, self._delete_now = [], [], []
        fsync_dir(self.directory)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
