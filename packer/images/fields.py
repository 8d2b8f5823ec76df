"""The fields' helpers under their earlier import path: they live in :mod:`packer.fields`
(one module a field kind), where new code imports them from."""

from __future__ import annotations

from ..fields.boxes import scale_boxes
from ..fields.mask import encode_mask, mask_shape, read_mask
from ..fields.sample import RESERVED_NAMES, FieldSources, check_field_name, process_sample

__all__ = ["FieldSources", "RESERVED_NAMES", "check_field_name", "read_mask", "encode_mask", "process_sample",
           "scale_boxes", "mask_shape"]
