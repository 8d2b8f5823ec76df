"""A full disk, for real (a 2 MB tmpfs): the one-line error reports what the failed write saw,
measured before the cleanup freed the partial output, and how much the output needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.formats.test_hostile import big_source, small_fs  # noqa: F401 - fixtures: 24 PNGs, a 2 MB tmpfs
from tests.helpers import ROOT


def size(shown: str) -> float:
    """Bytes of a size as packer shows it ("0 B", "2.1 MB")."""
    number, unit = shown.split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


@pytest.mark.parametrize("fmt", ["lmdb", "tar", "tfrecord"])
def test_disk_full_reports_the_space_when_the_write_failed(fmt, big_source, small_fs):  # noqa: F811
    dst = os.path.join(small_fs, "out")
    r = subprocess.run([sys.executable, "-m", "packer", "convert", "imagefolder", fmt, big_source, dst,
                        "--workers", "1", "--encode", "png"], capture_output=True, text=True, cwd=ROOT)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1, r.stderr
    line = err[0]
    assert line.startswith("packer: error: disk full: no space left on device while writing ")
    assert "free there now" not in line  # measured after the cleanup: the space the removal freed
    assert re.search(r"while writing \S+\.partial \(", line), line  # the file, not only its folder
    free = re.search(r"\(([\d.]+ [kMGB]+) free when the write failed", line)
    assert free and size(free.group(1)) < 1 << 20, line  # the disk was full then
    need = re.search(r"the output needs about ([\d.]+ [kMGB]+) in all|the write needed ([\d.]+ [kMGB]+)", line)
    assert need and size(need.group(1) or need.group(2)) > 0, line
    assert "the partial output was removed" in line and os.listdir(small_fs) == []
