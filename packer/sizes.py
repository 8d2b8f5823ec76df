"""Byte sizes written the way people write them: ``"256MB"``, ``"1GiB"``, ``"8 GB"``, ``4096``; and
durations in seconds taken from the environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = ["parse_size", "format_size", "seconds_from_env"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Return a byte count from an int or a string such as ``"256MB"`` (SI) or ``"1GiB"`` (binary).

    Raises ValueError naming the value when it is not a non-negative size.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 4096, 256MB, 1GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: float) -> str:
    """Return ``n`` bytes as a short human string, e.g. ``"12.3 MB"``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # unreachable, keeps type checkers calm


def seconds_from_env(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """The positive number of seconds in the environment variable ``name``, else ``default``;
    ValueError naming the variable and its value when it is not one."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name}={value!r} is not a positive number of seconds")
    return seconds
