"""The map-style dataset every format's reader builds on.

A format reader implements three things: ``_open()`` (handles, in the process that uses them),
``_close()``, and ``_read(i) -> Record`` (label, codec, size, key and payload bytes of sample i).
Everything else lives here once: the manifest, reading, output types and transforms here; the
fields plan (:mod:`~packer.datasets.fieldplan`), the cache (:mod:`~packer.datasets.readcache`)
and the error policy (:mod:`~packer.datasets.skipping`) in mixins, so a read stays one method
call on the dataset per step. Handles are opened lazily and dropped when pickled, so a dataset can be
sent to DataLoader workers under fork, spawn or forkserver, and a handle opened before a fork is
never used in the child (the pid is checked).
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.description.manifest import Manifest, read_manifest
from packer.description.record import Record
from packer.description.samples import SampleTable
from packer.errors import CorruptDataError
from packer.files.fileio import open_regular
from packer.images.placeholder import placeholder_reason
from packer.storage.datasetdir import DatasetDir

from .crops import Crop, as_crop
from .fieldplan import DEFAULT_FIELDS, FIELDS, FieldsPlan
from .fields import (
    FieldTuple,
    apply_transforms,
    tv_tensor_types,
)
from .readcache import CachedReads
from .shm.skips import SkipCounter
from .shm.worker_memory import settle_worker
from .skipping import SkipPolicy
from .v2fusion import Fusion, fuse_v2_crop

__all__ = ["PackedDataset", "OUTPUTS", "FIELDS"]

#: What ``__getitem__`` returns as the image: uint8 CHW tensor, HWC numpy array, PIL image, or the
#: stored bytes still encoded (decoded later, on the GPU: :mod:`packer.datasets.encoded`), or
#: torchvision's ``tv_tensors`` (the image an ``Image``, masks ``Mask``, boxes ``BoundingBoxes``).
OUTPUTS = ("tensor", "numpy", "pil", "encoded", "tv_tensors")


class PackedDataset(FieldsPlan, CachedReads, SkipPolicy, Dataset):
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
        fuse_crop: run the first crop of a torchvision v2 ``transform`` (or, without one,
            ``transforms``) in the decode, as ``crop=`` does: the same windows from the same torch
            draws, the rest of the pipeline after it (:mod:`packer.datasets.v2fusion`; ``self.fusion``
            says what was fused, None when nothing). ``False`` runs the pipeline as given;
            ``"opencv"`` resizes a bilinear ``RandomResizedCrop`` as ``crop=`` does (faster, close pixels).
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
        fuse_crop: bool | str = True,
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
        fields = self._plan_fields(fields, output, cache)
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
        self.fusion: Fusion | None = fuse_v2_crop(self, fuse_crop)
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
        self._request_cache(cache, cache_bytes)

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

    @property
    def label_kind(self) -> str:
        """``"class"``, ``"multi"`` (a list of classes per sample) or ``"number"``."""
        return self.manifest.label_kind

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

    def remote_traffic(self) -> tuple[int, int] | None:
        """For a dataset at a URL, ``(requests, bytes)`` that every process on this node has asked
        of the server for its files so far (the difference over an epoch: the epoch's cost, see
        docs/datasets.md); None for a local dataset."""
        traffic = getattr(self._remote, "traffic", None)
        return traffic() if traffic is not None else None

    @property
    def _ranged(self) -> bool:
        """True for a dataset at a URL read by byte range (:mod:`packer.storage.ranges`)."""
        return bool(getattr(self._remote, "ranged", False))

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
