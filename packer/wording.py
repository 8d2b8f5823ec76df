"""How counts and skip reasons are worded for the user: :func:`plural` (``1 sample``, ``2 samples``)
and :func:`describe_skips` (skips counted by reason, with the first files of each)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["plural", "noun", "skip_reasons", "describe_skips", "SkipGroup"]

#: Plurals that the spelling rules of :func:`noun` do not make.
_IRREGULAR = {"is": "are", "was": "were", "has": "have", "this": "these", "its": "their", "it": "them"}


def noun(n: int, word: str) -> str:
    """``word`` as it goes with the count ``n``: ``noun(1, "class") == "class"``,
    ``noun(2, "class") == "classes"``, ``noun(0, "entry") == "entries"``; a few verbs and
    pronouns too (``is``/``are``, ``has``/``have``, ``its``/``their``)."""
    if n == 1:
        return word
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def plural(n: int, word: str) -> str:
    """The count and the word that goes with it: ``plural(1, "sample") == "1 sample"``,
    ``plural(3, "file") == "3 files"``, ``plural(0, "image") == "0 images"``."""
    return f"{n} {noun(n, word)}"


#: A path or URL inside a reason (a token with a slash): one file's name, not the kind of skip.
_PATH = re.compile(r"[^\s\"'(),;]*[/\\][^\s\"'(),;]*")


def _reason_key(reason: str) -> str:
    """What skips of one kind share, their template: the reason with its paths and its numbers
    (sizes, pixel counts) left out."""
    return re.sub(r"\d+", "N", _PATH.sub("<path>", reason))


class SkipGroup(NamedTuple):
    """Skips of one template: the first one's reason as it was, how many, their first paths, and
    whether the group's reasons differ (in their numbers or the paths they name)."""

    reason: str
    count: int
    paths: list[str]
    varied: bool = False


def skip_reasons(skips: Iterable[tuple[str, str]], examples: int = 3) -> list[SkipGroup]:
    """Skips (``(path, reason)`` pairs) counted by reason, most frequent first (ties in the order
    first met), at most ``examples`` paths each. Reasons of one template (that differ only in their
    numbers or in the paths they name: ``5000x4000 = ... pixels``) count as one group, shown by the
    first of them as it was, with ``varied`` set."""
    groups: dict[str, SkipGroup] = {}
    for path, reason in skips:
        key = _reason_key(reason)
        g = groups.get(key)
        if g is None:
            g = groups[key] = SkipGroup(reason, 0, [])
        if len(g.paths) < examples:
            g.paths.append(path)
        groups[key] = g._replace(count=g.count + 1, varied=g.varied or reason != g.reason)
    return sorted(groups.values(), key=lambda g: -g.count)  # stable: ties keep the order first met


def describe_skips(skips: Iterable[tuple[str, str]], reasons: int = 5, examples: int = 3) -> str:
    """The skips counted by reason, on one line: ``2 for "cannot read: No such file or directory"
    (a.jpg, b.jpg); 1 for "empty file (0 bytes)" (c.jpg)``: the ``reasons`` most frequent, each with
    its first ``examples`` files (none with 0), then how many more there were for other reasons.
    A group whose reasons differ reads ``3 for reasons like "<the first, as it was>"``."""
    counted = skip_reasons(skips, examples)
    parts = []
    for g in counted[:reasons]:
        shown = f" ({', '.join(g.paths)}{', ...' if g.count > len(g.paths) else ''})" if g.paths else ""
        parts.append(f'{g.count} for {"reasons like " if g.varied else ""}"{g.reason}"{shown}')
    rest = counted[reasons:]
    if rest:
        parts.append(f"{sum(g.count for g in rest)} for {plural(len(rest), 'other reason')}")
    return "; ".join(parts)
