"""The map-style dataset every format's reader builds on.

A format reader implements three things: ``_open()`` (handles, in the process that uses them),
``_close()``, and ``_read(i) -> Record`` (label, codec, size, key and payload bytes of sample i).
Everything else lives here once: the manifest, decoding, output types, transforms, the error
policy and the cache. Handles are opened lazily and dropped when pickled, so a dataset can be
sent to DataLoader workers under fork, spawn or forkserver, and a handle opened before a fork is
never used in the child (the pid is checked).
"""

from __future__ import annotations

import copy
import os
import struct
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.description.manifest import Manifest, read_manifest
from packer.description.record import Record, pack_record, unpack_record
from packer.description.samples import SampleTable, table_entry
from packer.errors import CorruptDataError
from packer.fields import KINDS, Reading
from packer.fields.image import IMAGE
from packer.files.fileio import open_regular
from packer.images.imageproc import crop_window, decode_payload, decode_payload_window
from packer.images.placeholder import placeholder_reason
from packer.sizes import parse_size
from packer.storage.datasetdir import DatasetDir

from .crops import Crop, as_crop
from .fields import (
    FieldTuple,
    apply_transforms,
    check_fields,
    dataset_fields,
    move_boxes,
    output_kind,
    tv_tensor_types,
)
from .shm.cache import SharedCache
from .shm.skips import SkipCounter
from .shm.worker_memory import settle_worker

__all__ = ["PackedDataset", "OUTPUTS", "FIELDS"]

_META = struct.Struct("<IIq")  # decoded-cache entry header: height, width, label

#: What ``__getitem__`` returns as the image: uint8 CHW tensor, HWC numpy array, PIL image, or the
#: stored bytes still encoded (decoded later, on the GPU: :mod:`packer.datasets.encoded`), or
#: torchvision's ``tv_tensors`` (the image an ``Image``, masks ``Mask``, boxes ``BoundingBoxes``).
OUTPUTS = ("tensor", "numpy", "pil", "encoded", "tv_tensors")
#: What a sample can hold, for ``fields=``: the image (with ``output="encoded"``, the stored bytes),
#: the label (as the dataset's label kind has it), the source key, the metadata object, the
#: sample's index, and ``info``: ``(height, width, codec, index)`` of the stored image. Datasets
#: with fields add their own (:func:`~packer.datasets.fields.dataset_fields`): ``mask``, extra
#: images by name, ``boxes`` and ``box_labels``.
FIELDS = ("image", "label", "key", "meta", "index", "info")
DEFAULT_FIELDS = ("image", "label")
#: ``output="encoded"``'s default: what :func:`~packer.datasets.encoded.collate_encoded` batches.
ENCODED_FIELDS = ("image", "label", "info")


class PackedDataset(Dataset):
    """Map-style dataset over a packed directory; returns ``(image, label)``.

    Args:
        path: the packed dataset directory (must hold a finished manifest).
        transform: applied to the image (as torchvision's ``transform``).
        target_transform: applied to the label.
        output: ``"tensor"`` (uint8, C x H x W, RGB; the fast default), ``"numpy"`` (uint8 H x W x C),
            ``"pil"`` (a PIL RGB image, so a torchvision pipeline written for ImageFolder runs
            unchanged) or ``"tv_tensors"`` (torchvision's ``tv_tensors.Image``; masks ``Mask``,
            boxes ``BoundingBoxes`` in XYXY with the image's canvas size, so that a
            ``torchvision.transforms.v2`` pipeline moves them together). ``"encoded"`` skips the
            decode: each sample is ``(payload, target, (height, width, codec, index))``,
            ``payload`` a 1-D uint8 tensor of the stored bytes, batched by
            :func:`~packer.datasets.encoded.collate_encoded` and decoded by
            ``prefetch_to_device(..., decode=True)``; it takes no ``transform`` and no decoded cache.
        verify: check per-sample checksums on read (cheap next to decoding).
        on_error: ``"raise"`` (default) raises CorruptDataError naming file, sample and offset;
            ``"skip"`` returns the next readable sample instead, issues a
            :class:`~packer.datasets.shm.skips.SkippedSampleWarning` naming the sample, and counts the
            skip in ``self.errors``: one count shared by this process and all its DataLoader
            workers. Only when every sample of the dataset fails in a row does it raise, and from
            then on each read raises at once, counting nothing more; a dataset that fails its
            open check raises at once too (nothing was skipped: ``self.errors`` does not grow).
        cache: ``None`` (default), ``"encoded"`` (keep the stored bytes in RAM: no disk reads
            after the first epoch, decode every time) or ``"decoded"`` (keep the decoded pixels:
            no disk read and no decode after the first epoch). One cache in shared memory is
            used by this process and all its DataLoader workers (fork or spawn), filled on first
            access; see :mod:`packer.datasets.shm.cache`.
        crop: a crop the reader makes as it decodes, before ``transform``: an int or (height,
            width) for the centred crop, or a :class:`~packer.datasets.crops.RandomCrop` /
            :class:`~packer.datasets.crops.RandomResizedCrop`. JPEGs are then decoded only in
            the crop's window where packer's C module was built (same pixels as a whole decode
            cut to the window; :mod:`packer.datasets.crops`). A decoded cache keeps whole
            images and crops each read of them.
        cache_bytes: the cache's bound, an int or a size like ``"8GB"``; beyond it samples are
            read uncached. Default: what the whole dataset needs (from the manifest), clamped to
            the shared memory and RAM available. The capacity is reserved when the dataset is
            created.
        fields: what each sample returns, in order, from :data:`FIELDS`: ``"image"``,
            ``"label"`` (an int for class labels; for multi-label datasets a float32 multi-hot
            vector of ``len(classes)``, a NumPy array with ``output="numpy"``, else a tensor; for
            number labels a float), ``"key"`` (the source path),
            ``"meta"`` (the per-sample metadata dict, ``{}`` when none), ``"index"`` and ``"info"``
            (``(height, width, codec, index)`` of the stored image). Default ``("image", "label")``;
            with ``output="encoded"``, ``("image", "label", "info")``, the image being the stored bytes. Keys, labels and metadata come from the sample table, never
            from an image read; ``ds.targets`` and ``ds.keys`` give them for every sample.
            A dataset with fields adds its own names: ``"mask"`` (H x W label map, as the
            manifest's declared uint8 or uint16 for every sample), each extra image's name (decoded like the image), ``"boxes"`` (N x 4 float32,
            ``[x0, y0, x1, y1]`` in the returned image's pixels) and ``"box_labels"`` (N int64,
            -1 where a box has none); with ``output="encoded"`` masks and extra images are their
            stored bytes. A name the dataset lacks is a ValueError naming the ones it has.
        as_dict: return each sample as a dict keyed by ``fields`` instead of a tuple.
        transforms: one callable over the whole sample (torchvision ``VisionDataset``'s
            ``transforms``), applied last, after ``transform`` and ``target_transform``: called
            with the dict of fields under ``as_dict=True`` (and returning one), else with the
            fields as arguments (``transforms(image, mask, boxes)``, returning them as a tuple).
    """

    format: str = ""
    #: The URL a remote dataset was opened from (its files are read from the node cache's copy).
    url: str | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        output: str = "tensor",
        verify: bool = True,
        on_error: str = "raise",
        cache: str | None = None,
        cache_bytes: int | str | None = None,
        manifest: Manifest | None = None,
        remote_files: Callable[[str], int] | None = None,
        fields: Sequence[str] | None = None,
        crop: Crop | int | Sequence[int] | None = None,
        as_dict: bool = False,
        transforms: Callable[..., Any] | None = None,
    ) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")
        if output == "encoded" and crop is not None:
            raise ValueError("output='encoded' yields the stored bytes: crop them after the decode "
                             "(prefetch_to_device(..., decode=True, crop=...))")
        if output == "encoded" and (transform is not None or cache == "decoded"):
            raise ValueError("output='encoded' yields the stored bytes: it takes no transform (crop after the "
                             "decode, prefetch_to_device(..., decode=True, crop=...)) and no cache='decoded'")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.root = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.manifest = manifest if manifest is not None else read_manifest(self.root)
        if self.format and self.manifest.format != self.format:
            raise ValueError(
                f"{self.root} holds a {self.manifest.format!r} dataset, not {self.format!r}; "
                f"use packer.datasets.open_dataset to pick the reader from the manifest"
            )
        if fields is None:
            fields = ENCODED_FIELDS if output == "encoded" else DEFAULT_FIELDS
        fields = check_fields(fields, FIELDS, self.manifest, self.root)
        #: The requested names that are the dataset's own fields (read by :meth:`_load_fields`).
        self._own = tuple(f for f in fields if f in dataset_fields(self.manifest))
        #: The stored fields (masks, extra images) ``fields`` asks for: the only ones read.
        self._stored_wanted = tuple(f for f in self._own if f in self.manifest.stored_fields)
        stored = set(self.manifest.stored_fields)
        if cache == "decoded" and stored.intersection(fields):
            raise ValueError(f"cache='decoded' keeps the image's pixels only; {sorted(stored.intersection(fields))} "
                             f"are read from the records: use cache='encoded' (it keeps them with the image)")
        if output == "tv_tensors":
            tv_tensor_types()  # torchvision installed, or ImportError now rather than in a worker
        self.transforms = transforms
        self.transform = transform
        self.target_transform = target_transform
        self.crop = as_crop(crop)
        self.output = output
        self.fields = fields
        if as_dict and len(set(self.fields)) != len(self.fields):
            raise ValueError(f"as_dict=True: fields must not repeat a name, not {fields!r}")
        self.as_dict = bool(as_dict)
        self.verify = verify
        self.on_error = on_error
        self._skips = SkipCounter() if on_error == "skip" else None
        self._pid: int | None = None
        self._open_failure: tuple[int, CorruptDataError] | None = None  # (pid, error) of a failed open check
        self._unreadable: tuple[int, CorruptDataError] | None = None  # (pid, error): no sample reads (skip mode)
        self._dir: DatasetDir | None = None
        self._remote = remote_files  # a dataset at a URL: its files come through the node cache
        self._lock = threading.Lock()
        self._table: SampleTable | None = None
        self._table_pid: int | None = None
        if cache not in (None, "encoded", "decoded"):
            raise ValueError(f"cache must be None, 'encoded' or 'decoded', not {cache!r}")
        self.cache_mode = cache
        self.cache: SharedCache | None = None
        # The cache is created in this (the constructing) process once the format reader is fully
        # built: by open_dataset, or else at the first item read or pickling here. Workers never
        # create one: a reader built directly and first used inside forked workers reads uncached.
        self._cache_request: tuple[int, int | None] | None = None
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

    # -- what a format implements -------------------------------------------------------------
    def _open(self) -> None:
        """Open handles in the current process."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close handles opened by :meth:`_open`."""

    def _read(self, index: int, fields: Collection[str] | None = None) -> Record:
        """Return sample ``index``'s record with its stored ``fields`` (names; None: all), or with
        more where the format reads them together; raise CorruptDataError on bad data."""
        raise NotImplementedError

    # -- shared machinery ---------------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        """Class names in label order."""
        return self.manifest.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ImageFolder."""
        return self.manifest.class_to_idx

    @property
    def data_file(self) -> str:
        """The name of the dataset's first payload file (LMDB's and HDF5's only one): ``data.mdb``
        or ``data.h5``, or the name an upload over a live dataset gave it (packer.storage.remote)."""
        return next(f.name for f in self.manifest.files if f.samples)

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per payload file in sample order (the streaming dataset partitions by these)."""
        return [f.samples for f in self.manifest.files]

    def __len__(self) -> int:
        return self.manifest.num_samples

    # -- labels, keys and metadata without image reads ------------------------------------------
    @property
    def label_kind(self) -> str:
        """``"class"``, ``"multi"`` (a list of classes per sample) or ``"number"``."""
        return self.manifest.label_kind

    def sample_table(self) -> SampleTable | None:
        """The dataset's sample table (memory-mapped once per process), or None for datasets
        written without one (packer 0.1, or other tools' files)."""
        pid = os.getpid()
        if self._table is not None and self._table_pid == pid:
            return self._table
        entry = table_entry(self.manifest)
        if entry is None:
            return None
        self._ensure_open()
        assert self._dir is not None
        fd = self._dir.open(entry.name)
        try:  # checked, and bound to the manifest's entry: another conversion's table is refused
            table = SampleTable(fd, os.path.join(self.root, entry.name), self.manifest.num_samples, entry)
        finally:
            os.close(fd)
        if table.kind != self.label_kind:
            raise CorruptDataError(f"the sample table's label kind is {table.kind}, the manifest's "
                                   f"{self.label_kind}", path=table.path)
        self._table, self._table_pid = table, pid
        return table

    @property
    def targets(self) -> np.ndarray | list[list[int]]:
        """Every sample's label, in sample order, without reading an image: int64 class indices,
        float64 numbers, or lists of class indices (multi-label). For datasets without a sample
        table (packer 0.1, other tools' files) the labels come from the format's index, or else
        from reading each record's header."""
        table = self.sample_table()
        if table is not None:
            return table.targets
        return self._labels_without_table()

    @property
    def keys(self) -> Sequence[str]:
        """Every sample's key (its source path), in sample order, without reading an image."""
        table = self.sample_table()
        if table is not None:
            return table.keys
        return self._keys_without_table()

    def meta(self, index: int) -> dict[str, Any]:
        """Sample ``index``'s metadata (``{}`` when it has none)."""
        i = self._index(index)
        table = self.sample_table()
        return table.meta(i) if table is not None else self._meta_without_table(i)

    def _meta_without_table(self, index: int) -> dict[str, Any]:
        """Metadata of a dataset without a sample table: other tools' files override this."""
        return {}

    def _labels_without_table(self) -> np.ndarray:
        """Labels of a dataset without a sample table; formats with an index override this."""
        return np.array([self.read_record(i).label for i in range(len(self))], np.int64)

    def _keys_without_table(self) -> list[str]:
        """Keys of a dataset without a sample table; formats with an index override this."""
        return [self.read_record(i).key for i in range(len(self))]

    def _target(self, index: int, label: int) -> Any:
        """Sample ``index``'s label as ``fields`` returns it (before ``target_transform``): the class
        index (int), the number (float), or the multi-hot float32 vector of ``len(classes)``: a
        NumPy array with ``output="numpy"``, else a tensor (the one contract of every reader)."""
        kind = self.manifest.label_kind
        if kind == "class":
            return label
        table = self.sample_table()
        if table is None:
            raise CorruptDataError(f"a {kind}-label dataset needs its sample table", path=self.root)
        if kind == "number":
            return table.target_of(index)
        hot = np.zeros(len(self.classes), np.float32)
        hot[table.labels_of(index)] = 1.0
        return hot if self.output == "numpy" else torch.from_numpy(hot)

    def _ensure_open(self) -> None:
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    failed = self._open_failure
                    if failed is not None and failed[0] == pid:
                        # A file that failed its open check is not opened again in this process
                        # (with on_error="skip", each sample would open it and read its index).
                        raise copy.copy(failed[1])
                    self._pid = None  # a handle inherited across fork is never used
                    settle_worker()  # in DataLoader workers only; see worker_memory
                    if self._dir is not None:
                        self._dir.close()  # this process's copy of an inherited descriptor
                    # Every file is opened through the directory as it was when bound to our manifest.
                    self._dir = DatasetDir(self.root, self.manifest, bound=not self.manifest.layout.get("foreign"),
                                           fetch=self._remote)
                    try:
                        self._open()
                    except CorruptDataError as e:
                        self._open_failure = (pid, e)
                        raise
                    self._pid = pid

    def _read_small_file(self, name: str, what: str) -> bytes:
        """The whole of the dataset's (index) file ``name``, read at construction: a regular file
        inside the dataset, of the manifest's size, or CorruptDataError naming it as ``what``."""
        path = os.path.join(self.root, name)
        if self._remote is not None:  # downloaded and checked against its SHA-256 by the node cache
            with os.fdopen(self._remote(name), "rb") as f:
                return f.read()
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            raise CorruptDataError(f"{what} is missing", path=path) from None
        with os.fdopen(fd, "rb") as f:
            want = next((e.bytes for e in self.manifest.files if e.name == name), None)
            size = os.fstat(f.fileno()).st_size
            data = f.read(min(size, 256) if want is not None and size != want else -1)
        if want is not None and size != want:
            why = placeholder_reason(data[:256])
            raise CorruptDataError(f"{path} is {why}" if why else f"file is {size} bytes, the manifest says "
                                   f"{want}", path=path)
        return data

    def _open_file(self, name: str) -> int:
        """A descriptor of the dataset's file ``name``, opened through the bound directory (for
        ``_open`` and lazy opens): a regular file inside the dataset, of the manifest's size."""
        assert self._dir is not None, "_open_file outside _open"
        return self._dir.open(name)

    def read_record(self, index: int, fields: Collection[str] | None = None) -> Record:
        """The raw record of sample ``index`` (payload still encoded), checksum verified, with the
        stored fields named in ``fields`` (None: every one; a format may read more together)."""
        index = self._index(index)
        self._ensure_open()
        return self._read(index) if fields is None else self._read(index, fields=fields)

    def decode(self, rec: Record, index: int | None = None) -> np.ndarray:
        """Decode a record's payload to an RGB uint8 H x W x 3 array (with ``crop``, the crop)."""
        return self._decode_payload(rec.payload, rec.codec, rec.height, rec.width, index)

    def _decode_payload(self, payload: bytes | memoryview, codec: str, height: int, width: int,
                        index: int | None, path: str | None = None,
                        window: Callable[[int, int], Any] | None = None) -> np.ndarray:
        """A payload's pixels as the reader returns them: whole, or the crop's (only its window
        decoded where the payload allows; ``window`` instead of the crop's own draw); errors name
        ``path`` (default: the dataset)."""
        crop, path = self.crop, path or self.root
        if crop is None:
            return decode_payload(payload, codec, height, width, path=path, sample=index)
        return crop.finish(decode_payload_window(payload, codec, height, width, window or crop.window, path=path,
                                                 sample=index))

    def _cropped(self, rgb: np.ndarray, index: int | None, window: Callable[[int, int], Any] | None = None) -> np.ndarray:
        """Whole decoded pixels (a decoded cache's) cut as ``crop`` cuts them (in ``window``
        instead of the crop's own draw)."""
        crop = self.crop
        if crop is None:
            return rgb
        return crop.finish(crop_window(rgb, window or crop.window, path=self.root, sample=index))

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

    def _load_fields(self, index: int) -> tuple[dict[str, np.ndarray], int, Record | None, tuple[int, int]]:
        """Sample ``index``'s image (when asked for) and own fields, decoded and cut by one crop
        window; its label, its record (None from a decoded cache) and the (height, width) of the
        image returned."""
        if self._cache_request is not None:
            self._ensure_cache()
        rec, whole = None, None
        if self.cache is not None and self.cache_mode == "decoded":
            whole, label = self._whole_pixels(index)
            height, width = whole.shape[:2]
        else:
            rec = self.load_record(index, self._stored_wanted)
            label, height, width = rec.label, rec.height, rec.width
        window = self._draw_window(height, width, index)
        values: dict[str, np.ndarray] = {}
        if "image" in self.fields:
            if whole is not None:
                values["image"] = np.ascontiguousarray(self._cropped(whole, index, _fixed(window)))
            else:
                assert rec is not None
                values["image"] = self._decode_payload(rec.payload, rec.codec, height, width, index,
                                                       window=_fixed(window))
        self._own_values(index, rec, window, values)
        crop = self.crop
        return values, label, rec, crop.output_size(window) if crop is not None and window else (height, width)

    def _draw_window(self, height: int, width: int, index: int) -> tuple[int, int, int, int] | None:
        """The crop's window for a ``height`` x ``width`` sample, drawn once and checked to fit
        (ValueError naming the sample); None without a crop."""
        crop = self.crop
        if crop is None:
            return None
        drawn: list[tuple[int, int, int, int]] = []

        def draw(h: int, w: int) -> Any:
            drawn.append(crop.window(h, w))
            return drawn[0]

        crop_window(np.broadcast_to(np.uint8(0), (height, width)), draw, path=self.root, sample=index)
        top, left, h, w = (int(v) for v in drawn[0])
        return top, left, h, w

    def _own_values(self, index: int, rec: Record | None, window: tuple[int, int, int, int] | None,
                    values: dict[str, np.ndarray]) -> None:
        """Decode the requested masks and extra images of ``rec`` and look up the boxes, cut by
        ``window``, into ``values``."""
        crop = self.crop

        def decode(payload: Any, codec: str, height: int, width: int) -> np.ndarray:
            return self._decode_payload(payload, codec, height, width, index, window=_fixed(window))

        for f in self.manifest.fields:
            kind = KINDS[f["kind"]]
            if not any(o in self._own for o in kind.outputs(f["name"])):
                continue
            if kind.stored:
                at = Reading(self.root, index, f, crop, window, decode)
                values[f["name"]] = kind.load(self._stored_field(rec, f["name"], index), at)
            else:  # the boxes, from the sample table
                boxes, labels = self._boxes(index, rec)
                if crop is not None and window is not None:
                    boxes, labels = move_boxes(boxes, labels, window, crop.output_size(window))
                values.update(zip(kind.outputs(f["name"]), (boxes, labels)))

    def _stored_field(self, rec: Record | None, name: str, index: int) -> Any:
        """The stored field ``name`` of sample ``index``'s record, or CorruptDataError."""
        for f in rec.fields if rec is not None else ():
            if f.name == name:
                return f
        raise CorruptDataError(f"the sample has no {name!r} field, which the manifest lists", path=self.root,
                               sample=index)

    def _boxes(self, index: int, rec: Record | None) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``index``'s boxes (N x 4 float32) and box labels (N int64): the sample table's,
        or else the record's (other tools' data)."""
        table = self.sample_table()
        if table is not None and table.has_boxes:
            return table.boxes_of(index)
        if rec is None or rec.boxes is None:
            raise CorruptDataError("the samples' boxes are missing (the sample table has no boxes section)",
                                   path=self.root, sample=index)
        labels = rec.box_labels if rec.box_labels is not None else [-1] * len(rec.boxes)
        return np.array(rec.boxes, np.float32).reshape(-1, 4), np.array(labels, np.int64)

    def _to_output(self, rgb: np.ndarray) -> Any:
        if self.output == "tensor":
            return torch.from_numpy(rgb).permute(2, 0, 1)
        if self.output == "numpy":
            return rgb
        if self.output == "tv_tensors":
            return IMAGE.output("image", rgb, self.output, rgb.shape[:2])
        from PIL import Image

        return Image.fromarray(rgb, mode="RGB") if rgb.ndim == 3 else Image.fromarray(rgb)

    @property
    def errors(self) -> int:
        """Samples skipped by ``on_error="skip"`` so far, in this process and its DataLoader workers."""
        return self._skips.value if self._skips is not None else 0

    def _index(self, index: Any) -> int:
        """``index`` as a sample number (negative counts from the end), or IndexError/TypeError saying why not."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{type(self).__name__} indices must be integers, not {type(index).__name__} "
                            f"({index!r}); use a Subset or a sampler for slices")
        i = int(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {index} out of range for {n} samples in {self.root}")
        return i + n if i < 0 else i

    def _load_or_skip(self, index: int, load: Callable[[int], Any] | None = None) -> Any:
        """``load(index)`` (default :meth:`load`); with ``on_error="skip"``, the next sample that
        loads, counting each skip. Raises the last CorruptDataError only when every sample fails in
        a row, or at once when the dataset itself failed its open check (no sample can be read:
        nothing is counted). Once the dataset is known to be unreadable, each read raises that error
        again without retrying or counting its samples."""
        n = len(self)
        load = self.load if load is None else load
        pid = os.getpid()
        if self._skips is not None and self._unreadable is not None and self._unreadable[0] == pid:
            raise copy.copy(self._unreadable[1])
        for step in range(n):
            try:
                return load((index + step) % n)
            except CorruptDataError as e:
                if self._skips is None:
                    raise
                whole = self._open_failure is not None and self._open_failure[0] == pid
                if whole:
                    message = f"every sample of {self.root} is unreadable: the dataset failed its open check: {e}"
                elif step < n - 1:
                    self._skips.warn(str(e))
                    continue
                else:
                    self._skips.warn(str(e))
                    message = f"every sample of {self.root} failed to read; the last: {e}"
                err = CorruptDataError(message, path=e.path, sample=e.sample, offset=e.offset)
                self._unreadable = (pid, err)
                raise copy.copy(err) from e
        raise AssertionError("unreachable")  # pragma: no cover

    def _encoded_item(self, index: int) -> tuple[Any, ...]:
        """``__getitem__`` of ``output="encoded"``: ``fields`` with the stored bytes as the image;
        by default (payload, target, (height, width, codec, index))."""
        i, rec = self._load_or_skip(index, lambda j: (j, self.load_record(j)))
        payload = torch.from_numpy(np.frombuffer(rec.payload, np.uint8).copy())
        return self._fields_item(i, payload, rec.label, rec)

    def __getitem__(self, index: int) -> tuple[Any, ...] | dict[str, Any]:
        item = self._sample(index)
        return apply_transforms(self.transforms, dict(zip(self.fields, item)) if self.as_dict else item, self.fields)

    def _sample(self, index: int) -> tuple[Any, ...]:
        """Sample ``index`` as the tuple of ``fields`` (what ``__getitem__`` returns, or puts in a dict)."""
        if self.output == "encoded":
            return FieldTuple.of(self._encoded_item(self._index(index)), self.fields)
        if self._own:
            i, (values, label, rec, canvas) = self._load_or_skip(self._index(index),
                                                                 lambda j: (j, self._load_fields(j)))
            return FieldTuple.of(self._fields_item(i, values.get("image"), label, rec, (values, canvas)), self.fields)
        if self.fields == DEFAULT_FIELDS and self.manifest.label_kind == "class":
            rgb, label = self._load_or_skip(self._index(index))
            return self._item(rgb, label)
        i, (rgb, label) = self._load_or_skip(self._index(index), lambda j: (j, self.load(j)))
        return self._fields_item(i, rgb, label)

    def _fields_item(self, index: int, image: Any, label: int, rec: Record | None = None,
                     own: tuple[dict[str, np.ndarray], tuple[int, int]] | None = None) -> tuple[Any, ...]:
        """One sample as ``fields`` asks for it: ``image`` decoded pixels (or, with encoded output,
        the stored bytes as a tensor, returned as they are); ``own`` the dataset's own fields as
        :meth:`_load_fields` decoded them, with the returned image's (height, width)."""
        out: list[Any] = []
        encoded = self.output == "encoded"
        for name in self.fields:
            if name in self._own:
                out.append(self._own_output(name, index, rec, own))
            elif name == "image":
                if not encoded:
                    image = self._to_output(image)
                    out.append(self.transform(image) if self.transform is not None else image)
                else:
                    out.append(image)
            elif name == "label":
                target = self._target(index, label)
                out.append(self.target_transform(target) if self.target_transform is not None else target)
            elif name == "key":
                table = self.sample_table()
                out.append(table.keys[index] if table is not None else self.read_record(index).key)
            elif name == "meta":
                out.append(self.meta(index))
            elif name == "info":
                if rec is None:
                    rec = self.read_record(index)
                out.append((rec.height, rec.width, rec.codec, index))
            else:
                out.append(index)
        return tuple(out)

    def _own_output(self, name: str, index: int, rec: Record | None,
                    own: tuple[dict[str, np.ndarray], tuple[int, int]] | None) -> Any:
        """The dataset's own field ``name`` as ``output`` returns it; with encoded output, the
        stored bytes of a mask or an extra image as a 1-D uint8 tensor (boxes as tensors)."""
        field, kind = output_kind(self.manifest, name)
        if own is not None:
            return kind.output(name, own[0][name], self.output, own[1])
        if not kind.stored:  # the boxes: their outputs in order
            return torch.from_numpy(self._boxes(index, rec)[kind.outputs(field).index(name)])
        return torch.from_numpy(np.frombuffer(self._stored_field(rec, name, index).payload, np.uint8).copy())

    def _item(self, rgb: np.ndarray, label: int) -> tuple[Any, Any]:
        """(image, target) of decoded pixels: output conversion, then the transforms."""
        image = self._to_output(rgb)
        if self.transform is not None:
            image = self.transform(image)
        target: Any = label
        if self.target_transform is not None:
            target = self.target_transform(label)
        return image, target

    def _read_many(self, indices: list[int]) -> list[Record | CorruptDataError]:
        """The records of ``indices`` (valid sample numbers) in order, each a Record or the
        CorruptDataError reading it raised; handles are checked once for the whole batch."""
        self._ensure_open()
        out: list[Record | CorruptDataError] = []
        for i in indices:
            try:
                out.append(self._read(i))
            except CorruptDataError as e:
                out.append(e)
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]] | list[dict[str, Any]]:
        """``[self[i] for i in indices]`` (the DataLoader calls this with each batch's indices):
        the same items, order, errors, skips and transforms, with the per-sample lookups done once
        per batch (with a cache: one lookup and one store for the batch, each one hold of the
        cache's lock). A sample that fails to read or decode goes through ``self[i]`` itself, so
        the skip policy treats it exactly as a single read would. Datasets with encoded output or
        their own ``load`` (HDF5) read sample by sample."""
        if (self.output == "encoded" or type(self).load is not PackedDataset.load or self.transforms is not None
                or self.fields != DEFAULT_FIELDS or self.manifest.label_kind != "class"):
            return [self[i] for i in indices]
        if self._cache_request is not None:
            self._ensure_cache()
        valid: list[int] = []
        for index in indices:
            try:
                valid.append(self._index(index))
            except (IndexError, TypeError):
                break  # raised again below, in its place, after the samples before it
        cache = self.cache
        views: list[memoryview | None] = [None] * len(valid) if cache is None else cache.get_many(valid)
        misses = [i for i, view in zip(valid, views) if view is None]
        records = iter(self._read_many(misses) if misses else ())  # all hits: the files stay closed
        out: list[tuple[Any, ...]] = []
        store: list[tuple[int, Any]] = []
        for i, view in zip(valid, views):
            try:
                if view is not None:
                    rgb, label = self._from_cache(view, i)
                else:
                    rec = next(records)
                    if isinstance(rec, CorruptDataError):
                        raise rec
                    label = rec.label
                    if cache is None:
                        rgb = self.decode(rec, i)
                    else:
                        rgb, entry = self._decoded_for_cache(rec, i)
                        store.append((i, entry))
            except CorruptDataError:
                if self._skips is None:
                    raise
                out.append(self._sample(i))  # skips, warns and counts as ds[i] does
                continue
            out.append(self._item(rgb, label))
        if store:
            cache.put_many(store)  # type: ignore[union-attr]
        if len(valid) < len(indices):
            self._index(indices[len(valid)])
        return [dict(zip(self.fields, item)) for item in out] if self.as_dict else out

    def close(self) -> None:
        """Close handles in this process (they reopen on the next access) and release the cache."""
        if self._pid == os.getpid():
            self._close()
            if self._dir is not None:
                self._dir.close()
        self._dir = None
        self._pid = None
        if self._table is not None and self._table_pid == os.getpid():
            self._table.close()
        self._table = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def __getstate__(self) -> dict[str, Any]:
        self._ensure_cache()
        state = self.__dict__.copy()
        state["_pid"] = None
        state["_open_failure"] = None
        state["_unreadable"] = None
        state["_lock"] = None
        state["_dir"] = None
        state["_table"] = None
        state["_table_pid"] = None
        for k in self._handle_attrs():
            state[k] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _handle_attrs(self) -> tuple[str, ...]:
        """Attribute names holding process-local handles, dropped on pickling."""
        return ()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
            f"encoding={self.manifest.processing.get('encoding')!r}, output={self.output!r})"
        )

    def __enter__(self) -> PackedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fixed(window: tuple[int, int, int, int] | None) -> Callable[[int, int], Any] | None:
    """A crop-window function that gives ``window`` whatever the size (None for None)."""
    return None if window is None else (lambda height, width: window)


def _cache_record(rec: Record) -> bytes:
    """What the encoded cache keeps of a record: unseeded, with its masks and extra images."""
    return pack_record(rec.key, rec.label, rec.codec, rec.height, rec.width, bytes(rec.payload),
                       fields=rec.fields or None)
