"""Field kinds: what a sample may carry besides its image and label, one module a kind and one
table, :data:`KINDS`, the only place the kinds are listed (the manifest's ``fields[].kind``)."""

from __future__ import annotations

from .base import FieldKind, Reading
from .boxes import BOXES
from .image import IMAGE
from .mask import MASK

__all__ = ["FieldKind", "Reading", "KINDS", "FIELD_KINDS", "kind", "named"]

#: Kind name -> kind: adding a kind is one module and one row here.
KINDS: dict[str, FieldKind] = {k.name: k for k in (MASK, IMAGE, BOXES)}
#: The built-in kinds' names, in the table's order.
FIELD_KINDS = tuple(KINDS)


def kind(name: str) -> FieldKind:
    """The kind named ``name``; ValueError naming the kinds there are."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"no field kind {name!r}: the kinds are {', '.join(KINDS)}") from None


def named(field: str) -> FieldKind:
    """The kind of a field named ``field``: the kind that fixes that name (the mask is named
    ``mask``), else the kind that its source names (extra images)."""
    for k in KINDS.values():
        if k.field_name == field:
            return k
    return next(k for k in KINDS.values() if k.field_name is None)
