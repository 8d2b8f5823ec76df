"""The sample table is checked whole once per node; later opens map it and touch only what they read."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

import packer.description.nodecheck as nodecheck
from packer.description.samples import SampleTable, build_table
from packer.errors import CorruptDataError

N = 4_000


def _key(i: int) -> str:
    return f"class{i * 10 // N:02d}/{i:08d}-" + "k" * 1000  # a keys section of ~4 MB


@pytest.fixture
def stamped(tmp_path, monkeypatch):
    """A table of N samples made 'old' (its mtime in the past) and a private stamp folder."""
    monkeypatch.setenv("PACKER_CHECKED_DIR", str(tmp_path / "stamps"))
    monkeypatch.setattr(nodecheck, "SETTLED_NS", 0)
    path = str(tmp_path / "samples.table")
    build_table(path, "class", ((_key(i), i * 10 // N) for i in range(N)))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def _open(path: str) -> SampleTable:
    fd = os.open(path, os.O_RDONLY)
    try:
        return SampleTable(fd, path, N)
    finally:
        os.close(fd)


def _mapped_kb(path: str) -> int:
    """Resident kB of this process's mappings of ``path``."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def _opened_in_child(path: str) -> tuple[bool, int, str]:
    t = _open(path)
    return t.checked_here, int(t.targets.sum()), t.keys[N - 1]


def test_second_open_skips_the_check_and_reads_only_the_labels(stamped):
    first = _open(stamped)
    assert first.checked_here and _mapped_kb(stamped) > 4000  # the check read every page
    del first
    second = _open(stamped)
    assert not second.checked_here
    want = np.arange(N) * 10 // N
    assert np.array_equal(second.targets, want) and not second.targets.flags.writeable
    assert _mapped_kb(stamped) < 8 * N / 1024 + 200  # the labels (160 kB) and pages around them, no keys
    assert second.keys[N - 1] == _key(N - 1) and list(second.keys[:3]) == [_key(i) for i in range(3)]
    with multiprocessing.get_context("fork").Pool(1) as pool:  # another process on the node: no check either
        assert pool.apply(_opened_in_child, (stamped,)) == (False, int(want.sum()), _key(N - 1))
    assert len([n for n in os.listdir(os.environ["PACKER_CHECKED_DIR"] + f"/packer-checked-{os.getuid()}")
                if not n.endswith(".lock")]) == 1


def test_a_changed_table_is_checked_again(stamped):
    _open(stamped)
    with open(stamped, "r+b") as f:  # one key byte altered: the file's times move, the stamp no longer fits
        f.seek(os.path.getsize(stamped) - 5)
        f.write(b"X")
    with pytest.raises(CorruptDataError, match="checksum mismatch"):
        _open(stamped)


def test_a_damaged_table_leaves_no_stamp(stamped):
    with open(stamped, "r+b") as f:
        f.seek(os.path.getsize(stamped) - 5)
        f.write(b"X")
    os.utime(stamped, ns=(1_000_000_000, 1_000_000_000))
    for _ in range(2):
        with pytest.raises(CorruptDataError, match="checksum mismatch"):
            _open(stamped)


def test_fresh_files_and_shared_folders_are_checked_every_time(tmp_path, monkeypatch):
    path = str(tmp_path / "samples.table")
    build_table(path, "class", ((_key(i), 0) for i in range(10)))
    monkeypatch.setenv("PACKER_CHECKED_DIR", str(tmp_path / "stamps"))
    fd = os.open(path, os.O_RDONLY)
    try:  # written just now: its times may still share a clock tick with a later write
        assert [SampleTable(fd, path).checked_here for _ in range(2)] == [True, True]
        monkeypatch.setattr(nodecheck, "SETTLED_NS", 0)
        os.chmod(tmp_path / "stamps" / f"packer-checked-{os.getuid()}", 0o777)  # not private: not trusted
        assert nodecheck.stamp_folder() is None
        assert [SampleTable(fd, path).checked_here for _ in range(2)] == [True, True]
    finally:
        os.close(fd)
