"""The LMDB page parser (packer.layouts.lmdb.LMDBFile) against files written by py-lmdb itself:
leaf, branch and overflow pages, every value byte for byte, and clean errors for damage."""

from __future__ import annotations

import os

import lmdb
import pytest

from packer.description.record import pack_record
from packer.errors import CorruptDataError
from packer.layouts.lmdb import LMDBFile, lmdb_key


def _write(path: str, values: list[bytes], txn_size: int = 50) -> str:
    env = lmdb.open(path, subdir=False, lock=False, map_size=1 << 28, meminit=True)
    for start in range(0, len(values), txn_size):
        with env.begin(write=True) as txn:
            for i in range(start, min(start + txn_size, len(values))):
                txn.put(lmdb_key(i), values[i], append=True)
    env.sync(True)
    env.close()
    return path


def _values(n: int, big_every: int = 7) -> list[bytes]:
    """Packer records: small ones (leaf pages) and every ``big_every``-th larger than a page (overflow)."""
    out = []
    for i in range(n):
        size = 9000 + i if i % big_every == 0 else 40 + i % 300
        out.append(pack_record(f"k/{i}", i % 5, "png", 1, 1, bytes([i % 251]) * size, seed=i))
    return out


@pytest.mark.parametrize("n", [1, 3, 600])
def test_every_value_matches_py_lmdb(tmp_path, n):
    vals = _values(n)
    path = _write(str(tmp_path / "data.mdb"), vals)
    f = LMDBFile(path, n)
    try:
        for i in range(n):
            assert bytes(f.read(i)) == vals[i]
        for i in reversed(range(n)):  # leaf cache in the other direction
            assert bytes(f.read(i)) == vals[i]
    finally:
        f.close()
    if n == 600:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False)
        assert env.stat()["depth"] >= 2 and env.stat()["overflow_pages"] > 0  # branch and overflow pages seen
        env.close()


def test_entry_count_must_match_the_manifest(tmp_path):
    path = _write(str(tmp_path / "data.mdb"), _values(10))
    with pytest.raises(CorruptDataError, match="holds 10 entries, the manifest 11 samples"):
        LMDBFile(path, 11)


def test_damaged_meta_and_truncation_are_named(tmp_path):
    vals = _values(50)
    path = _write(str(tmp_path / "data.mdb"), vals)
    data = bytearray(open(path, "rb").read())
    trunc = str(tmp_path / "trunc.mdb")
    open(trunc, "wb").write(data[: len(data) // 2])
    with pytest.raises(CorruptDataError, match="truncated"):
        LMDBFile(trunc, 50)
    bad = bytearray(data)
    for page in (0, 1):  # both meta pages' magic
        psize = 4096
        bad[page * psize + 16] ^= 0xFF
    damaged = str(tmp_path / "meta.mdb")
    open(damaged, "wb").write(bad)
    with pytest.raises(CorruptDataError) as e:
        LMDBFile(damaged, 50)
    assert e.value.path == damaged and e.value.offset is not None


def test_keys_that_are_not_the_sample_index_are_refused(tmp_path):
    path = str(tmp_path / "data.mdb")
    env = lmdb.open(path, subdir=False, lock=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"%010d" % 0, _values(1)[0])
        txn.put(b"%010d" % 5, _values(1)[0])  # a gap: the second entry is not sample 1
    env.close()
    f = LMDBFile(path, 2)
    try:
        f.read(0)
        with pytest.raises(CorruptDataError, match="sample 1"):
            f.read(1)
    finally:
        f.close()


def test_not_an_lmdb_file_is_named(tmp_path):
    path = str(tmp_path / "data.mdb")
    open(path, "wb").write(b"hello" * 100)
    with pytest.raises(CorruptDataError, match="not an LMDB file"):
        LMDBFile(path, 1)
    assert os.path.exists(path)


def test_branch_pages_kept_are_bounded(tmp_path, monkeypatch):
    """A reader keeps at most BRANCH_PAGES parsed branch pages (what it holds does not grow with
    the dataset), and reads in any order stay right as pages are dropped and parsed again."""
    import random

    import packer.layouts.lmdb as layout

    monkeypatch.setattr(layout, "BRANCH_PAGES", 2)
    n = 12_000
    vals = [pack_record(f"k/{i}", i % 5, "png", 1, 1, bytes([i % 251]) * 20, seed=i) for i in range(n)]
    path = _write(str(tmp_path / "data.mdb"), vals, txn_size=4000)
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    assert env.stat()["depth"] >= 3 and env.stat()["branch_pages"] > 2
    env.close()
    f = LMDBFile(path, n)
    try:
        order = list(range(n))
        random.Random(0).shuffle(order)
        for i in order[:3000]:
            assert bytes(f.read(i)) == vals[i]
            assert len(f._branches) <= 2
    finally:
        f.close()
