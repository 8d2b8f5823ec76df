"""A sample's fields besides the image, as the readers return them: masks, extra images, boxes.

A mask is decoded from its stored PNG, values unchanged, as the dtype the manifest declares for
every mask of the dataset (H x W uint8 or uint16; a version 3 dataset's as each is stored); an
extra image like the image; boxes (N x 4 float32, ``[x0, y0, x1, y1]`` in stored pixels) and their labels (N int64, -1
where a box has none) come from the sample table. Nothing is decoded unless it is asked for. A
reader's crop cuts the image, the mask and the extra images with one window and moves the boxes
with it: shifted, clipped to the window, scaled with a resizing crop; a box left with no area is
dropped with its label (as torchvision's ``SanitizeBoundingBoxes`` drops it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from packer.description.manifest import Manifest
from packer.fields import KINDS, FieldKind
from packer.fields.base import tv_tensor_types
from packer.fields.boxes import move_boxes
from packer.fields.mask import cut_mask, decode_mask

__all__ = ["dataset_fields", "check_fields", "decode_mask", "move_boxes", "field_output", "tv_tensor_types",
           "PER_SAMPLE", "FieldTuple", "apply_transforms", "cut_mask",
           "output_kind"]

#: Fields with a count per sample (boxes), which ``collate`` returns as a list per batch.
PER_SAMPLE = frozenset(o for k in KINDS.values() if k.field_name for o in k.outputs(k.field_name) if k.per_sample(o))


class FieldTuple(tuple):
    """A reader's sample as a tuple that knows which of its positions hold a field with a count
    per sample (:data:`PER_SAMPLE`), so that ``collate`` lists them instead of stacking them."""

    per_sample: frozenset[int] = frozenset()

    @classmethod
    def of(cls, item: Sequence[Any], names: Sequence[str]) -> tuple[Any, ...]:
        """``item`` (the values of ``names``) as a FieldTuple where a name is in :data:`PER_SAMPLE`,
        else as the plain tuple."""
        listed = frozenset(k for k, name in enumerate(names) if name in PER_SAMPLE)
        if not listed:
            return tuple(item)
        out = cls(item)
        out.per_sample = listed
        return out


def dataset_fields(manifest: Manifest) -> tuple[str, ...]:
    """The names a dataset's samples hold besides the image and label, for ``fields=``: its mask,
    extra images and boxes as the manifest lists them, and ``box_labels`` after ``boxes``."""
    out: list[str] = []
    for name in manifest.field_names:
        out.extend(KINDS[str(manifest.field_kind(name))].outputs(name))
    return tuple(out)


def output_kind(manifest: Manifest, output: str) -> tuple[str, FieldKind]:
    """The field (its name) and kind of one of the dataset's own output names (``box_labels``:
    the boxes'); KeyError when the manifest has no field giving it."""
    for f in manifest.fields:
        kind = KINDS[f["kind"]]
        if output in kind.outputs(f["name"]):
            return f["name"], kind
    raise KeyError(output)


def check_fields(fields: Any, common: Sequence[str], manifest: Manifest, root: str) -> tuple[str, ...]:
    """``fields`` as a tuple, or ValueError naming what the dataset at ``root`` has."""
    own = dataset_fields(manifest)
    names = (*common, *own)
    if isinstance(fields, str) or not fields or any(f not in names for f in fields):
        has = f"its fields: {', '.join(own)}" if own else "no mask, extra images or boxes"
        raise ValueError(f"fields must be a non-empty sequence of {names}, not {fields!r} ({root} has {has})")
    return tuple(fields)


def apply_transforms(transforms: Any, item: tuple[Any, ...] | dict[str, Any], names: Sequence[str]) -> Any:
    """A sample through a whole-sample ``transforms``: a dict as its one argument (its result
    returned as it is), a tuple's values as its arguments (the result a tuple of ``names``)."""
    if transforms is None or isinstance(item, dict):
        return item if transforms is None else transforms(item)
    out = transforms(*item)
    return FieldTuple.of((out,) if len(item) == 1 else tuple(out), names)


def field_output(kind: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
    """One decoded field as ``output`` returns it: ``kind`` a field kind's name (``"mask"``,
    ``"image"``, ``"boxes"``) or ``"box_labels"``; ``canvas`` the (height, width) the boxes lie in."""
    k = KINDS.get(kind) or next(k for k in KINDS.values() if k.field_name and kind in k.outputs(k.field_name))
    return k.output(kind, value, output, canvas)
