"""How counts and skip reasons are worded for the user: :func:`plural` (``1 sample``, ``2 samples``)
and :func:`describe_skips` (skips counted by reason, with the first files of each)."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["plural", "noun", "skip_reasons", "describe_skips"]

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


def _reason_key(reason: str) -> str:
    """What skips of one kind share: the reason with its numbers left out (sizes, pixel counts)."""
    return re.sub(r"\d+", "N", reason)


def skip_reasons(skips: Iterable[tuple[str, str]], examples: int = 3) -> list[tuple[str, int, list[str]]]:
    """Skips (``(path, reason)`` pairs) counted by reason, most frequent first (ties in the order
    first met): ``(reason, count, first paths)``, at most ``examples`` paths each. Reasons that
    differ only in their numbers (``5000x4000 = ... pixels``) count as one, shown with ``N`` for
    the numbers where they differ."""
    groups: dict[str, list] = {}
    for path, reason in skips:
        g = groups.setdefault(_reason_key(reason), [reason, 0, []])
        if g[0] != reason:
            g[0] = _reason_key(reason)
        g[1] += 1
        if len(g[2]) < examples:
            g[2].append(path)
    ordered = sorted(groups.values(), key=lambda g: -g[1])  # stable: ties keep the order first met
    return [(reason, count, paths) for reason, count, paths in ordered]


def describe_skips(skips: Iterable[tuple[str, str]], reasons: int = 5, examples: int = 3) -> str:
    """The skips counted by reason, on one line: ``2 for "cannot read: No such file or directory"
    (a.jpg, b.jpg); 1 for "empty file (0 bytes)" (c.jpg)``: the ``reasons`` most frequent, each with
    its first ``examples`` files (none with 0), then how many more there were for other reasons."""
    counted = skip_reasons(skips, examples)
    parts = []
    for reason, count, paths in counted[:reasons]:
        shown = f" ({', '.join(paths)}{', ...' if count > len(paths) else ''})" if paths else ""
        parts.append(f'{count} for "{reason}"{shown}')
    rest = counted[reasons:]
    if rest:
        parts.append(f"{sum(c for _, c, _ in rest)} for {plural(len(rest), 'other reason')}")
    return "; ".join(parts)
