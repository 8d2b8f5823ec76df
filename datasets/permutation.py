"""A keyed bijection of ``[0, n)`` computed per element: a Feistel network with cycle-walking.

``permute(x, n, keys)`` maps each ``x[i]`` in ``[0, n[i])`` to its image under the permutation
of ``[0, n[i])`` chosen by ``keys[i]``, without building the permutation: O(1) time and memory per
element, so any position of a shuffled epoch is found without the positions before it.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from numpy.typing import NDArray

__all__ = ["mix64", "derive_key", "permute"]

_ROUNDS = 4  # Luby-Rackoff: four rounds of a pseudo-random function give a pseudo-random permutation
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15


def mix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64's finaliser, element-wise: a bijection of 64-bit words with full avalanche."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def derive_key(*words: int) -> int:
    """A 64-bit key from any non-negative integers (a seed of up to 128 bits, epoch, rank, ...)."""
    blob = b"".join(struct.pack("<QQ", w % 2**64, w >> 64) for w in words)
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8, person=b"packer-plan").digest(), "little")


def _feistel(x: NDArray[np.uint64], half: NDArray[np.uint64], round_keys: list[NDArray[np.uint64]]) -> NDArray[np.uint64]:
    """One pass of the balanced Feistel network on ``2 * half`` bits (half >= 1 per element)."""
    mask = (np.uint64(1) << half) - np.uint64(1)
    left, right = x >> half, x & mask
    for rk in round_keys:
        left, right = right, left ^ (mix64(right ^ rk) & mask)
    return (left << half) | right


def permute(x: NDArray[np.int64], n: NDArray[np.int64] | int, keys: NDArray[np.uint64] | int) -> NDArray[np.int64]:
    """The images of ``x`` (each ``0 <= x < n``) under the keyed permutations of ``[0, n)``.

    ``n`` and ``keys`` are scalars or arrays like ``x`` (one domain and key per element). The
    network runs on the smallest even number of bits covering ``n``; an image that falls at or
    past ``n`` is permuted again (cycle-walking) until it lands inside, which keeps it a bijection
    of ``[0, n)``. The domain is under 4n, so an element takes under four passes on average.
    """
    x = np.asarray(x, dtype=np.int64)
    size = np.broadcast_to(np.asarray(n, dtype=np.int64), x.shape)
    key = np.broadcast_to(np.asarray(keys, dtype=np.uint64), x.shape)
    bits = np.zeros(x.shape, dtype=np.int64)
    big = size > 1
    if big.any():  # bits = ceil(log2(n)) rounded up to even, at least 2
        bits[big] = np.ceil(np.log2(size[big].astype(np.float64))).astype(np.int64)
        exact = (np.int64(1) << np.minimum(bits, 62)) >= size  # log2 of floats may be off by one
        bits = np.where(big & ~exact, bits + 1, bits)
    half = np.maximum((bits + 1) // 2, 1).astype(np.uint64)
    out = x.astype(np.uint64)
    todo = np.flatnonzero(big)
    if not todo.size:
        return x.copy()
    half, limit = half[todo], size[todo].astype(np.uint64)
    round_keys = [mix64(key[todo] + np.uint64((r * _GOLDEN) % 2**64)) for r in range(_ROUNDS)]
    value = out[todo]
    pending = np.arange(len(todo))
    while pending.size:  # cycle-walking: permute again what fell outside [0, n)
        value[pending] = _feistel(value[pending], half[pending], [k[pending] for k in round_keys])
        pending = pending[value[pending] >= limit[pending]]
    out[todo] = value
    return out.astype(np.int64)
