"""The sources of a weighted mixture read by ``StreamingDataset([path_a, path_b], weights=...)``.

How many samples each source gives an epoch, where its samples sit among the global indices the
partition plan uses, and what a global index reads (labels kept per source, or mapped onto one
class list by name). The order itself is :func:`packer.datasets.partition.rank_indices`'.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from packer.checks import check_int

from .fields import FieldTuple, apply_transforms

__all__ = ["MixOptions", "Mixture", "apportion"]

_CLASS_MODES = ("source", "union")


def apportion(weights: Sequence[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; ties to the first).

    ``apportion([0.7, 0.3], 2000) == [1400, 600]``; the counts always add up to ``total``.
    """
    total = check_int("epoch_samples", total, 0)
    shares = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class MixOptions:
    """How sources are mixed.

    Attributes:
        weights: each source's share of an epoch (positive, any scale); ``None``: in proportion
            to the sources' sizes.
        epoch_samples: samples per epoch over all ranks; ``None``: the sum of the sources' sizes.
        return_source: yield ``(image, label, source)``, the source's index in the list.
        classes: ``"source"``: each source keeps its own labels (see ``source_classes``);
            ``"union"``: labels are mapped by class name onto one list, the first source's
            classes then the new names of each following source.
    """

    weights: tuple[float, ...] | None = None
    epoch_samples: int | None = None
    return_source: bool = False
    classes: str = "source"

    def __post_init__(self) -> None:
        if self.weights is not None:
            weights = tuple(self.weights)
            for w in weights:
                if isinstance(w, bool) or not isinstance(w, (int, float)):
                    raise TypeError(f"weights must be numbers, got {w!r}")
                if not (w >= 0 and math.isfinite(w)):
                    raise ValueError(f"weights must be finite and >= 0, got {w!r}")
            if not sum(weights) > 0:
                raise ValueError(f"weights must not all be 0, got {list(weights)}")
            object.__setattr__(self, "weights", weights)
        if self.epoch_samples is not None:
            object.__setattr__(self, "epoch_samples",
                               check_int("epoch_samples", self.epoch_samples, 0))
        if not isinstance(self.return_source, bool):
            raise TypeError(f"return_source must be a bool, got {self.return_source!r}")
        if self.classes not in _CLASS_MODES:
            raise ValueError(f"classes must be 'source' or 'union', got {self.classes!r}")


class Mixture:
    """The readers of a mixture, their place among the global indices, and their draws per epoch.

    Global index ``firsts[s] + i`` is sample ``i`` of source ``s``. ``takes[s]`` samples of
    source ``s`` are read per epoch.
    """

    def __init__(self, readers: list[Any], options: MixOptions,
                 target_transform: Callable[[int], Any] | None, fields: Sequence[str] | None = None, *,
                 as_dict: bool = False, transforms: Callable[..., Any] | None = None) -> None:
        """``fields``: what a sample returns (as the readers' ``fields=``, plus ``"source"``, the
        source's index in the list); None: ``(image, label[, ...], source if return_source)``.
        ``as_dict``: each sample a dict keyed by those names instead of a tuple. ``transforms``:
        the readers' whole-sample transforms, applied here to the mixture's sample."""
        sizes = [len(r) for r in readers]
        weights = options.weights if options.weights is not None else sizes
        if len(weights) != len(readers):
            raise ValueError(f"weights must give one weight per source ({len(readers)}), "
                             f"got {len(weights)}")
        total = sum(sizes) if options.epoch_samples is None else options.epoch_samples
        self.takes = apportion(weights, total)
        for s, (take, n) in enumerate(zip(self.takes, sizes)):
            if take and not n:
                raise ValueError(f"{readers[s].root}: this source is empty but has weight "
                                 f"{weights[s]}")
        self.readers, self.options = readers, options
        self.firsts = [sum(sizes[:s]) for s in range(len(sizes))]
        self.target_transform = target_transform
        self.transforms = transforms
        self.union: list[str] | None = None
        self.label_maps: list[list[int]] | None = None
        self.fields = tuple(fields) if fields is not None else None
        self.names: tuple[str, ...] | None = None
        if as_dict:
            self.names = self.fields if self.fields is not None else (
                *readers[0].fields, *(("source",) if options.return_source else ()))
            if len(set(self.names)) != len(self.names):
                raise ValueError(f"as_dict=True: fields must not repeat a name, not {self.names!r}")
        if options.classes == "union":
            kinds = {getattr(r, "label_kind", "class") for r in readers}
            if kinds != {"class"}:
                raise ValueError(f"classes='union' maps class labels by name; these sources have {sorted(kinds)} labels")
            self.union = list(dict.fromkeys(c for r in readers for c in r.classes))
            index = {c: i for i, c in enumerate(self.union)}
            self.label_maps = [[index[c] for c in r.classes] for r in readers]

    @property
    def root(self) -> str:
        """The sources' directories, for messages."""
        return " + ".join(r.root for r in self.readers)

    @property
    def classes(self) -> list[str]:
        """The class list of every label: the union, or the sources' one shared list."""
        if self.union is not None:
            return self.union
        lists = [r.classes for r in self.readers]
        if any(c != lists[0] for c in lists):
            raise ValueError(f"{self.root}: the sources have different class lists; use "
                             f"source_classes with return_source=True, or classes='union'")
        return lists[0]

    def _fields_item(self, s: int, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """A reader's item (its fields without ``"source"``) as ``self.fields`` orders them."""
        values = iter(item)
        out: list[Any] = []
        for name in self.fields or ():
            if name == "source":
                out.append(s)
                continue
            value = next(values)
            if name == "label":
                if self.label_maps is not None:
                    value = self.label_maps[s][value]
                if self.target_transform is not None:
                    value = self.target_transform(value)
            out.append(value)
        return FieldTuple.of(out, self.fields or ())

    def fingerprint(self, one: Callable[[Any], str]) -> str:
        """A short digest of the sources' fingerprints, in order."""
        blob = "+".join(one(r) for r in self.readers).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __getitem__(self, index: int) -> tuple[Any, ...] | dict[str, Any]:
        item = self._sample(index)
        names = self.names or self.fields or ()
        return apply_transforms(self.transforms, dict(zip(self.names, item)) if self.names is not None else item,
                                names)

    def _sample(self, index: int) -> tuple[Any, ...]:
        s = bisect.bisect_right(self.firsts, index) - 1
        if self.fields is not None:
            return self._fields_item(s, self.readers[s][index - self.firsts[s]])
        image, label, *rest = self.readers[s][index - self.firsts[s]]  # rest: output="encoded"
        if self.label_maps is not None:
            label = self.label_maps[s][label]
        if self.target_transform is not None:
            label = self.target_transform(label)
        return (image, label, *rest, s) if self.options.return_source else (image, label, *rest)
