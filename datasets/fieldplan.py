"""The fields plan of :class:`~packer.datasets.base.PackedDataset`, mixed into it: what each
sample returns (``fields``) and where each value comes from: the image's record and decoder, the
sample table (labels, keys, metadata and boxes without an image read), and the dataset's own
fields (masks, extra images, boxes), decoded and cut by one crop window.

A mixin, not a helper object, so that a read calls these methods on the dataset itself, with no
hop per sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from packer.description.manifest import Manifest
from packer.description.record import Record
from packer.description.samples import SampleTable, table_entry
from packer.errors import CorruptDataError
from packer.fields import KINDS, Reading
from packer.fields.image import IMAGE
from packer.images.imageproc import crop_window, decode_payload, decode_payload_window
from packer.storage.datasetdir import DatasetDir

from .crops import Crop
from .fields import check_fields, dataset_fields, output_kind

__all__ = ["FieldsPlan", "FIELDS", "DEFAULT_FIELDS", "ENCODED_FIELDS"]

#: What a sample can hold, for ``fields=``: the image (with ``output="encoded"``, the stored bytes),
#: the label (as the dataset's label kind has it), the source key, the metadata object, the
#: sample's index, and ``info``: ``(height, width, codec, index)`` of the stored image. Datasets
#: with fields add their own (:func:`~packer.datasets.fields.dataset_fields`): ``mask``, extra
#: images by name, ``boxes`` and ``box_labels``.
FIELDS = ("image", "label", "key", "meta", "index", "info")
DEFAULT_FIELDS = ("image", "label")
#: ``output="encoded"``'s default: what :func:`~packer.datasets.encoded.collate_encoded` batches.
ENCODED_FIELDS = ("image", "label", "info")


class FieldsPlan:
    """The fields' part of :class:`~packer.datasets.base.PackedDataset` (its attributes are set
    by the dataset's constructor)."""

    manifest: Manifest
    root: str
    output: str
    fields: tuple[str, ...]
    crop: Crop | None
    _own: tuple[str, ...]
    _stored_wanted: tuple[str, ...]
    _dir: DatasetDir | None
    _table: SampleTable | None
    _table_pid: int | None

    def _plan_fields(self, fields: Sequence[str] | None, output: str, cache: str | None) -> tuple[str, ...]:
        """``fields`` checked against the dataset (None: the default of ``output``), noting which
        are the dataset's own and which of those are stored in the records."""
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
        return fields

    def decode(self, rec: Record, index: int | None = None) -> np.ndarray:
        """Decode a record's payload to an RGB uint8 H x W x 3 array (with ``crop``, the crop)."""
        return self._decode_payload(rec.payload, rec.codec, rec.height, rec.width, index)

    def _decode_payload(self, payload: bytes | memoryview, codec: str, height: int, width: int,
                        index: int | None, path: str | None = None,
                        window: Callable[[int, int], Any] | None = None, scale: int = 1) -> np.ndarray:
        """A payload's pixels as the reader returns them: whole, or the crop's (only its window
        decoded where the payload allows; ``window`` instead of the crop's own draw, decoded at
        1/``scale`` where it is a JPEG); errors name ``path`` (default: the dataset). Without
        ``window``, a crop that reduces picks the scale of a JPEG's window as it is drawn."""
        crop, path = self.crop, path or self.root
        if crop is None:
            return decode_payload(payload, codec, height, width, path=path, sample=index)
        reduce = crop.reduction if window is None and crop.reduces else None  # drawn for the JPEG's frame
        return crop.finish(decode_payload_window(payload, codec, height, width, window or crop.window,
                                                 scale=scale if codec == "jpeg" else 1, reduce=reduce, path=path,
                                                 sample=index))

    def _cropped(self, rgb: np.ndarray, index: int | None, window: Callable[[int, int], Any] | None = None) -> np.ndarray:
        """Whole decoded pixels (a decoded cache's) cut as ``crop`` cuts them (in ``window``
        instead of the crop's own draw)."""
        crop = self.crop
        if crop is None:
            return rgb
        return crop.finish(crop_window(rgb, window or crop.window, path=self.root, sample=index))

    def _to_output(self, rgb: np.ndarray) -> Any:
        if self.output == "tensor":
            return torch.from_numpy(rgb).permute(2, 0, 1)
        if self.output == "numpy":
            return rgb
        if self.output == "tv_tensors":
            return IMAGE.output("image", rgb, self.output, rgb.shape[:2])
        from PIL import Image

        return Image.fromarray(rgb, mode="RGB") if rgb.ndim == 3 else Image.fromarray(rgb)

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
        """Every sample's label, in sample order, without reading an image: class indices (a
        read-only view of the sample table's column, in the narrowest integer dtype that holds
        them; int64 for tables before version 3 and datasets without one), float64 numbers, or
        lists of class indices (multi-label). For datasets without a sample
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
        window, scale = self._draw_window(height, width, index), 1
        if rec is not None and rec.codec == "jpeg" and window is not None and self.crop is not None:
            scale, window = self.crop.reduction(window, height, width)  # masks and boxes cut alike
        values: dict[str, np.ndarray] = {}
        if "image" in self.fields:
            if whole is not None:
                values["image"] = np.ascontiguousarray(self._cropped(whole, index, _fixed(window)))
            else:
                assert rec is not None
                values["image"] = self._decode_payload(rec.payload, rec.codec, height, width, index,
                                                       window=_fixed(window), scale=scale)
        self._own_values(index, rec, window, values, scale)
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
                    values: dict[str, np.ndarray], scale: int = 1) -> None:
        """Decode the requested masks and extra images of ``rec`` and look up the boxes, cut by
        ``window``, into ``values`` (JPEG extra images at the image's ``scale``)."""
        crop = self.crop

        def decode(payload: Any, codec: str, height: int, width: int) -> np.ndarray:
            return self._decode_payload(payload, codec, height, width, index, window=_fixed(window), scale=scale)

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
                    boxes, labels = crop.move_boxes(boxes, labels, window)
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


def _fixed(window: tuple[int, int, int, int] | None) -> Callable[[int, int], Any] | None:
    """A crop-window function that gives ``window`` whatever the size (None for None)."""
    return None if window is None else (lambda height, width: window)
