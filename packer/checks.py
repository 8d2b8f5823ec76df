"""Argument checks shared by every layer: one rule for "an integer in a range"."""

from __future__ import annotations

import operator

__all__ = ["check_int"]


def check_int(name: str, value: object, low: int | None, high: int | None = None) -> int:
    """``value`` as a plain ``int`` with ``low <= value`` (and ``value < high`` when given).

    ``low=None`` checks only that ``value`` is an integer (a caller with its own range message).

    Accepts ``int`` and anything with ``__index__`` (NumPy integers); refuses ``bool``. Raises
    TypeError for a non-integer and ValueError for one out of range, each a single line naming
    ``name``, e.g. ``"batch_size must be >= 1, got 0"`` or ``"worker must be in [0, 4), got 4"``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None
    if low is None:
        return v
    if v < low or (high is not None and v >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v
