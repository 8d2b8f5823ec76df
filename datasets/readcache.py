"""The reader's cache (``cache="encoded"`` or ``"decoded"``), mixed into
:class:`~packer.datasets.base.PackedDataset`: created in the process that built the reader,
filled on misses, one :class:`~packer.datasets.shm.cache.SharedCache` for it and its workers.

An entry is a record (encoded: unseeded, with its masks and extra images) or a decoded image's
pixels after a small header (height, width, label). A mixin, not a helper object, so that a read
(``ds[i]``, ``__getitems__``) calls these methods on the dataset itself, with no hop per sample.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection
from typing import Any

import numpy as np

from packer.description.manifest import Manifest
from packer.description.record import Record, pack_record, unpack_record
from packer.errors import CorruptDataError
from packer.images.imageproc import decode_payload
from packer.sizes import parse_size

from .shm.cache import SharedCache

__all__ = ["CachedReads"]

_META = struct.Struct("<IIq")  # decoded-cache entry header: height, width, label


class CachedReads:
    """The cache's part of :class:`~packer.datasets.base.PackedDataset` (its attributes are set
    by the dataset's constructor)."""

    manifest: Manifest
    root: str
    cache_mode: str | None
    cache: SharedCache | None
    _cache_request: tuple[int, int | None] | None

    def _request_cache(self, cache: str | None, cache_bytes: int | str | None) -> None:
        """Check ``cache`` and note the request: the cache itself is made by :meth:`_ensure_cache`."""
        if cache not in (None, "encoded", "decoded"):
            raise ValueError(f"cache must be None, 'encoded' or 'decoded', not {cache!r}")
        self.cache_mode = cache
        self.cache = None
        # The cache is created in this (the constructing) process once the format reader is fully
        # built: by open_dataset, or else at the first item read or pickling here. Workers never
        # create one: a reader built directly and first used inside forked workers reads uncached.
        self._cache_request = None
        if cache is not None:
            self._cache_request = (os.getpid(), parse_size(cache_bytes) if cache_bytes is not None else None)

    def _ensure_cache(self) -> None:
        """Create the requested cache if this is the process that constructed the dataset."""
        request = self._cache_request
        if request is None or request[0] != os.getpid():
            return
        self._cache_request = None
        need = request[1] if request[1] is not None else self._cache_estimate(str(self.cache_mode))
        # Ranks of one job on one node that open the same dataset share one cache (packer.datasets.shm.cache).
        self.cache = SharedCache(self.manifest.num_samples, need,
                                 identity=str(self.cache_mode).encode() + b"\0" + self.manifest.dumps())

    def _cache_estimate(self, mode: str) -> int:
        """Bytes the whole dataset takes in the cache, with a small margin.

        Encoded: the payload files' size plus room for each entry's header, key and alignment.
        Decoded: the mean pixel size of up to 64 samples spread over the dataset (headers only
        for raw; reading a few records costs milliseconds), times the sample count, plus 5%.
        """
        n = self.manifest.num_samples
        payload = sum(f.bytes for f in self.manifest.files)
        if mode == "encoded":
            return payload + 192 * n + (1 << 20)
        probe = sorted({int(i) for i in np.linspace(0, n - 1, num=min(n, 64))})
        sizes = []
        for i in probe:
            try:
                rec = self.read_record(i)
            except CorruptDataError:
                if i == probe[-1] and not sizes:
                    raise
                continue  # a damaged sample is reported (or skipped) where it is read, not here
            sizes.append(rec.height * rec.width * 3)
        mean = sum(sizes) / len(sizes)
        return int(mean * n * 1.05) + (_META.size + 64) * n + (1 << 20)

    def load(self, index: int) -> tuple[np.ndarray, int]:
        """Sample ``index`` as (RGB uint8 H x W x 3 array, label), before output conversion."""
        if self._cache_request is not None:
            self._ensure_cache()
        cache = self.cache
        if cache is None:
            rec = self.read_record(index)
            return self.decode(rec, index), rec.label
        view = cache.get(index)
        if view is not None:
            return self._from_cache(view, index)
        rec = self.read_record(index)
        rgb, entry = self._decoded_for_cache(rec, index)
        cache.put(index, entry)
        return rgb, rec.label

    def _decoded_for_cache(self, rec: Record, index: int) -> tuple[np.ndarray, Any]:
        """(the pixels the reader returns, the cache entry) of a record read on a cache miss: a
        decoded cache keeps the whole image, also under ``crop``."""
        if self.cache_mode == "decoded" and self.crop is not None:
            whole = decode_payload(rec.payload, rec.codec, rec.height, rec.width, path=self.root, sample=index)
            return self._cropped(whole, index), self._cache_entry(rec, whole)
        rgb = self.decode(rec, index)
        return rgb, self._cache_entry(rec, rgb)

    def _from_cache(self, view: memoryview, index: int) -> tuple[np.ndarray, int]:
        """(pixels the caller owns, label) of a cache entry."""
        if self.cache_mode == "decoded":
            h, w, label = _META.unpack_from(view, 0)
            pixels = np.frombuffer(view, np.uint8, offset=_META.size).reshape(h, w, 3)
            if self.crop is None:
                return pixels.copy(), label
            return np.ascontiguousarray(self._cropped(pixels, index)), label
        rec = unpack_record(view, verify=False)
        return self.decode(rec, index), rec.label

    def _cache_entry(self, rec: Record, rgb: np.ndarray) -> tuple[bytes, np.ndarray] | bytes:
        """What the cache keeps of a sample just read: its pixels with their shape and label, or
        its record."""
        if self.cache_mode == "decoded":
            return _META.pack(rgb.shape[0], rgb.shape[1], rec.label), rgb
        return _cache_record(rec)

    def load_record(self, index: int, fields: Collection[str] | None = None) -> Record:
        """Sample ``index``'s record, payload still encoded, through the encoded cache when there
        is one (which keeps whole records); without it, with the stored ``fields`` named (None: all)."""
        if self._cache_request is not None:
            self._ensure_cache()
        cache = self.cache
        if cache is None or self.cache_mode != "encoded":
            return self.read_record(index, fields)
        view = cache.get(index)
        if view is not None:
            return unpack_record(view, verify=False)
        rec = self.read_record(index)
        cache.put(index, _cache_record(rec))
        return rec

    def _whole_pixels(self, index: int) -> tuple[np.ndarray, int]:
        """(whole decoded pixels the caller owns, label) of sample ``index`` through the decoded
        cache (filling it on a miss)."""
        cache = self.cache
        assert cache is not None
        view = cache.get(index)
        if view is not None:
            h, w, label = _META.unpack_from(view, 0)
            return np.frombuffer(view, np.uint8, offset=_META.size).reshape(h, w, 3).copy(), label
        rec = self.read_record(index)
        whole = decode_payload(rec.payload, rec.codec, rec.height, rec.width, path=self.root, sample=index)
        cache.put(index, self._cache_entry(rec, whole))
        return whole, rec.label


def _cache_record(rec: Record) -> bytes:
    """What the encoded cache keeps of a record: unseeded, with its masks and extra images."""
    return pack_record(rec.key, rec.label, rec.codec, rec.height, rec.width, bytes(rec.payload),
                       fields=rec.fields or None)
