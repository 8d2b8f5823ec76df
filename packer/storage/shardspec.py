"""Shards as users name them: a list of shard files or URLs, or a brace pattern such as
``data/shard-{000000..000009}.tar`` or ``s3://bucket/train/shard-{000..099}.tfrecord``.

:func:`expand_braces` is packer's own small, strict expander (WebDataset's ``braceexpand`` habit,
without its leniency): ``{A..B}`` with decimal A <= B (zero-padded to the width of A when A has
a leading zero or A and B have the same width), and ``{x,y,z}`` lists; several groups multiply;
a brace that is not part of a group, nesting, an empty item or a descending range is an error.
:func:`resolve_paths` tells a list of files (the shards of one dataset) from a list of dataset
folders or URLs (a mixture), and refuses anything in between with one line naming what it found.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import PackerError
from ..files.filesystem import is_url
from ..wording import plural

__all__ = ["ShardSpecError", "ShardList", "has_braces", "expand_braces", "resolve_paths"]

#: Ranges longer than this are refused (a typo such as ``{0..9999999999}``, not a dataset).
MAX_EXPANSION = 1_000_000

_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


class ShardSpecError(PackerError, ValueError):
    """A list of paths or a brace pattern that names no dataset unambiguously."""


def has_braces(text: str) -> bool:
    """Whether ``text`` is a brace pattern (holds ``{`` or ``}``)."""
    return "{" in text or "}" in text


def _group_items(body: str, pattern: str) -> list[str]:
    m = _RANGE.fullmatch(body)
    if m:
        a, b = m.groups()
        lo, hi = int(a), int(b)
        if lo > hi:
            raise ShardSpecError(f"brace pattern {pattern!r}: the range {{{body}}} counts down; write {{{b}..{a}}}")
        if hi - lo >= MAX_EXPANSION:
            raise ShardSpecError(f"brace pattern {pattern!r}: {{{body}}} names more than {MAX_EXPANSION:,} files")
        width = len(a) if (a.startswith("0") and len(a) > 1) or len(a) == len(b) else 0
        return [f"{n:0{width}d}" for n in range(lo, hi + 1)]
    if ".." in body or "," not in body:
        raise ShardSpecError(f"brace pattern {pattern!r}: {{{body}}} is neither a range of numbers {{000..099}} "
                             f"nor a list {{a,b}}")
    items = body.split(",")
    if not all(items):
        raise ShardSpecError(f"brace pattern {pattern!r}: the list {{{body}}} has an empty item")
    return items


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in order (the last group varies fastest); ShardSpecError
    for a malformed pattern (see the module docstring)."""
    groups = list(_GROUP.finditer(pattern))
    literals, at = [], 0
    for g in groups:
        literals.append(pattern[at:g.start()])
        at = g.end()
    literals.append(pattern[at:])
    stray = next((c for lit in literals for c in lit if c in "{}"), None)
    if stray is not None:
        raise ShardSpecError(f"brace pattern {pattern!r}: an unmatched or nested {stray!r}")
    choices = [_group_items(g.group(1), pattern) for g in groups]
    total = 1
    for c in choices:
        total *= len(c)
    if total > MAX_EXPANSION:
        raise ShardSpecError(f"brace pattern {pattern!r} names {total:,} files, more than {MAX_EXPANSION:,}")
    out = []
    for combo in itertools.product(*choices):
        out.append("".join(lit + part for lit, part in itertools.zip_longest(literals, combo, fillvalue="")))
    return out


@dataclass(frozen=True)
class ShardList:
    """What a path, a list of paths or a pattern names: ``files`` (local paths made absolute, or
    URLs) that are the shards of one dataset, or ``datasets`` (folders or URLs) that are a mixture;
    exactly one of the two is non-empty. ``pattern`` is the brace pattern it came from, if any."""

    files: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    pattern: str | None = None


def _shown(names: Sequence[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _kind(path: str, file_suffixes: tuple[str, ...]) -> str:
    """``file``, ``dataset`` or ``missing``: a URL is a file when it ends with a shard suffix; a
    brace pattern in a list is one dataset (a mixture's source)."""
    if has_braces(path):
        return "dataset"
    if is_url(path):
        return "file" if path.rstrip("/").lower().endswith(file_suffixes) else "dataset"
    if os.path.isdir(path):
        return "dataset"
    return "file" if os.path.isfile(path) else "missing"


def resolve_paths(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                  file_suffixes: tuple[str, ...]) -> ShardList | None:
    """What ``spec`` names: None for one path without braces (a dataset folder, a URL, or one
    file: the caller's existing rules); else a :class:`ShardList`. A pattern's names must all exist
    (locally; URLs are checked when read). ``file_suffixes`` tell a shard URL from a dataset URL.
    ShardSpecError for an empty list, a missing path, duplicates, or files mixed with folders."""
    pattern = None
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if not has_braces(text):
            return None
        pattern = text
        paths = expand_braces(os.path.expanduser(text))
    elif isinstance(spec, (bytes, bytearray)):
        raise ShardSpecError("give paths as str, not bytes")
    else:
        paths = [os.fspath(p) for p in spec]
        if not all(isinstance(p, str) for p in paths):
            raise ShardSpecError("give paths as str or os.PathLike")
    if not paths:
        raise ShardSpecError("an empty list of paths: give shard files, or dataset folders for a mixture")
    paths = [p if is_url(p) else os.path.abspath(os.path.expanduser(p)) for p in paths]
    kinds: dict[str, list[str]] = {"file": [], "dataset": [], "missing": []}
    for p in paths:
        kinds[_kind(p, file_suffixes)].append(p)
    if kinds["missing"]:
        missing = kinds["missing"]
        if pattern is not None and len(missing) == len(paths):
            raise ShardSpecError(f"brace pattern {pattern} matches nothing: no file {_shown(missing, 2)}")
        where = f"brace pattern {pattern}: " if pattern else ""
        raise ShardSpecError(f"{where}{len(missing)} of {len(paths)} paths do not exist: {_shown(missing)}")
    if kinds["file"] and kinds["dataset"]:
        raise ShardSpecError(
            f"{plural(len(kinds['file']), 'file')} ({_shown(kinds['file'], 2)}) and "
            f"{plural(len(kinds['dataset']), 'dataset')} "
            f"({_shown(kinds['dataset'], 2)}): a list of shard files is one dataset, a list of datasets (folders, "
            f"URLs or patterns) is a mixture; give one or the other")
    dup = next((p for p, n in Counter(paths).items() if n > 1), None)
    if dup is not None:
        raise ShardSpecError(f"{dup} is named twice; each shard or dataset once")
    if kinds["file"]:
        return ShardList(files=tuple(paths), pattern=pattern)
    return ShardList(datasets=tuple(paths), pattern=pattern)
