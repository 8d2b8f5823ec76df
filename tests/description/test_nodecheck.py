"""The sample table is checked once per node, a section at a time (version 3: labels at open, keys
when first asked for); later opens map it and touch only what they read."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

import packer.description.nodecheck as nodecheck
from packer.description.samples import SampleTable, build_table
from packer.description.sections import unpack_header
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
    # the check read every byte through one buffer: none of the table's pages is mapped by it
    assert first.checked_here and _mapped_kb(stamped) < 64 + 4
    assert _mapped_kb(stamped) * 1024 < os.path.getsize(stamped) / 50
    del first
    second = _open(stamped)
    assert not second.checked_here
    want = np.arange(N) * 10 // N
    assert np.array_equal(second.targets, want) and not second.targets.flags.writeable
    assert _mapped_kb(stamped) < 8 * N / 1024 + 200  # the labels (160 kB) and pages around them, no keys
    assert second.keys[N - 1] == _key(N - 1) and list(second.keys[:3]) == [_key(i) for i in range(3)]
    with multiprocessing.get_context("fork").Pool(1) as pool:  # another process on the node: no check either
        assert pool.apply(_opened_in_child, (stamped,)) == (False, int(want.sum()), _key(N - 1))
    # two stamps: the labels' (at the first open) and the keys' (at the first read of a key)
    assert len([n for n in os.listdir(os.environ["PACKER_CHECKED_DIR"] + f"/packer-checked-{os.getuid()}")
                if not n.endswith(".lock")]) == 2


def _damage_a_key(path: str) -> None:
    """Alter one byte of the last key (the keys section: its offsets, then the blob)."""
    with open(path, "rb") as f:
        head = unpack_header(f.read(176), os.path.getsize(path), path, 3)
    offset, length, _crc = head.sections["keys"]
    with open(path, "r+b") as f:
        f.seek(offset + 8 * N + head.k - 3)
        f.write(b"X")


def test_keys_are_checked_when_first_read_and_named(stamped):
    """A damaged keys section does not fail the open (labels are intact and checked) but the
    first read of a key, naming the file and the section, in every process until it is mended."""
    _damage_a_key(stamped)
    os.utime(stamped, ns=(1_000_000_000, 1_000_000_000))
    for _ in range(2):
        table = _open(stamped)
        assert np.array_equal(table.targets, np.arange(N) * 10 // N)
        with pytest.raises(CorruptDataError, match=r"keys section is damaged \(checksum mismatch\).*samples.table"):
            table.keys[0]
        with pytest.raises(CorruptDataError, match="keys section is damaged"):
            table.check_all()


def test_a_changed_table_is_checked_again(stamped):
    _open(stamped)
    with open(stamped, "r+b") as f:
        f.seek(176)  # one label byte altered: the file's times move, the stamp no longer fits
        f.write(b"X")
    with pytest.raises(CorruptDataError, match="labels section is damaged .checksum mismatch"):
        _open(stamped)


def test_a_damaged_table_leaves_no_stamp(stamped):
    with open(stamped, "r+b") as f:
        f.seek(176)
        f.write(b"X")
    os.utime(stamped, ns=(1_000_000_000, 1_000_000_000))
    for _ in range(2):
        with pytest.raises(CorruptDataError, match="labels section is damaged"):
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


def test_scan_finds_disorder_across_its_chunks(tmp_path, monkeypatch):
    """The whole-file check reads through one small buffer: its CRC is the file's, and offsets that
    decrease across a chunk's edge, or end short of their total, are found as within one."""
    import crc32c

    monkeypatch.setattr(nodecheck, "SCAN_BYTES", 64)
    ends = np.arange(1, 101, dtype="<u8") * 3
    path = tmp_path / "f"
    path.write_bytes(bytes(8) + ends.tobytes() + ends.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.path.getsize(path)
        good = [(8, 100, 300), (808, 100, 300)]
        assert nodecheck.scan_file(fd, 8, size, good) == (crc32c.crc32c(path.read_bytes()[8:]), None)
        assert nodecheck.scan_file(fd, 8, size, [(8, 100, 300), (808, 100, 301)])[1] == 1  # ends short
        bad = ends.copy()
        bad[4] = 1  # the first value of a 64-byte chunk (file offset 840), lower than the last of the one before
        path.write_bytes(bytes(8) + ends.tobytes() + bad.tobytes())
        assert nodecheck.scan_file(fd, 8, size, good)[1] == 1
    finally:
        os.close(fd)
