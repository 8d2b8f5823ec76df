"""HDF5 files read in bounded memory whatever the file declares, and a disk filled after the
free-space check is one line, not a crash."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.formats.test_hostile import big_source, small_fs  # noqa: F401  (fixtures: a 24-image source, a 2 MB tmpfs)
from tests.helpers import ROOT, make_folder, pack


# -- bounded memory for any HDF5 file -----------------------------------------------------------------
def _forged_h5(tmp_path, replace, encode="png"):
    """A small packed HDF5 dataset whose data.h5 is rebuilt with ``replace(new_file, old_file)``
    swapping some datasets (the rest copied as they are); the manifest is forged to match."""
    import h5py

    from tests.helpers import forge_manifest_sizes

    src = str(tmp_path / "src")
    make_folder(src, {"a": [("x.png", 8, 8), ("y.png", 8, 8)]})
    dst = str(tmp_path / "out")
    pack(src, dst, "hdf5", encode=encode)
    path = os.path.join(dst, "data.h5")
    os.rename(path, path + ".old")
    with h5py.File(path + ".old", "r") as old, h5py.File(path, "w") as new:
        for k, v in old.attrs.items():
            new.attrs[k] = v
        skip = replace(new, old) or ()
        for name in old:
            if name not in new and name not in skip:  # contiguous copies: the file stays a few kB
                d = new.create_dataset(name, data=old[name][()], dtype=old[name].dtype)
                d.attrs.update(old[name].attrs)
    os.remove(path + ".old")
    forge_manifest_sizes(dst)
    return dst


_PEAK_RSS = """
import resource, sys
from packer.datasets import open_dataset
from packer.errors import CorruptDataError
try:
    ds = open_dataset(sys.argv[1], output="numpy")
    print("read", [ds.read_record(i).label for i in range(len(ds))])
except CorruptDataError as e:
    print("refused", e)
print("rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _open_measured(dst):
    """What opening and reading every sample gives, and the peak RSS in MiB, in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _PEAK_RSS, dst], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    return lines[0], int(lines[-1].split()[1])


def _baseline_rss():
    r = subprocess.run([sys.executable, "-c", _PEAK_RSS.replace("open_dataset(sys.argv[1]", "(lambda *a, **k: [])(0")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return int(r.stdout.strip().splitlines()[-1].split()[1])


def test_hdf5_rows_declared_but_not_stored_are_refused_before_allocating(tmp_path):
    """An 8 kB data.h5 whose per-sample datasets declare 50 million rows (nothing stored): 2.2 GB
    peak RSS at open before."""
    import numpy as np

    n = 50_000_000

    def replace(new, old):
        for name, shape, dt in (("labels", (n,), np.int64), ("shapes", (n, 2), np.uint32),
                                ("crc32c", (n,), np.uint32), ("key_crc32c", (n,), np.uint32),
                                ("offsets", (n + 1,), np.uint64)):
            new.create_dataset(name, shape, dt, chunks=(65536, *shape[1:]))

    dst = _forged_h5(tmp_path, replace)
    assert os.path.getsize(os.path.join(dst, "data.h5")) < 16_000
    what, rss = _open_measured(dst)
    assert what.startswith("refused") and "/labels has 50000000 rows, the manifest says 2" in what, what
    assert rss < _baseline_rss() + 100, rss


def test_hdf5_rows_the_manifest_agrees_with_but_the_file_does_not_store_are_refused(tmp_path):
    import json

    import numpy as np

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    n = 4000

    def replace(new, old):
        new.create_dataset("labels", (n,), np.int64, chunks=(1024,))

    dst = _forged_h5(tmp_path, replace)
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["num_samples"] = d["files"][0]["samples"] = n
    json.dump(d, open(path, "w"))
    with pytest.raises(CorruptDataError, match=r"/labels declares 32000 bytes of rows, but they are not stored"):
        open_dataset(dst)[0]


def test_hdf5_keys_declared_but_not_stored_are_refused_before_reading(tmp_path):
    """/keys as two fixed-width strings of 100 MB, nothing stored: read_record read 200 MB for them."""
    def replace(new, old):
        new.create_dataset("keys", (2,), "S100000000", chunks=(1,))

    dst = _forged_h5(tmp_path, replace)
    what, rss = _open_measured(dst)
    assert what.startswith("refused") and "/keys declares 200000000 bytes of rows" in what, what
    assert rss < _baseline_rss() + 100, rss


def test_hdf5_image_rows_whose_size_overflows_int64_are_refused(tmp_path):
    """Raw rows of 2^32 x 2^32 x 3 bytes: their size wrapped to 0 in int64 and passed the checks."""
    import numpy as np

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    def replace(new, old):
        new.create_dataset("images", (2, 2**32, 2**32, 3), np.uint8, chunks=(1, 1, 16, 3))

    dst = _forged_h5(tmp_path, replace, encode="raw")
    with pytest.raises(CorruptDataError, match="the samples need 110680464442257309696 bytes of /images"):
        open_dataset(dst)[0]


def test_hdf5_one_byte_chunks_do_not_make_a_chunk_table(tmp_path):
    """/images in 1-byte chunks over a 270 MB extent (what a careless h5repack -l CHUNK=1 gives):
    2.3 GB peak RSS for the chunk address table before; now read through h5py, every sample."""
    import numpy as np

    def replace(new, old):
        data = old["images"][()]
        d = new.create_dataset("images", (270_000_000,), np.uint8, chunks=(1,))
        d[: len(data)] = data

    dst = _forged_h5(tmp_path, replace)
    what, rss = _open_measured(dst)
    assert what == "read [0, 0]", what
    assert rss < _baseline_rss() + 100, rss


# -- HDF5: disk full after the free-space check ------------------------------------------------------

_FILL_AFTER_CHECK = """
import sys
from packer.converters import hdf5
hdf5.no_room = lambda *a, **k: None  # the free-space check passed; another process then took the room
if __name__ == "__main__":
    from packer.cli import main
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_hdf5_disk_filled_after_the_space_check_is_one_line_not_a_crash(big_source, small_fs, tmp_path,  # noqa: F811
                                                                         workers):
    """HDF5 2.0 cannot close a file after a failed write: the interpreter printed h5py tracebacks
    after the clean message and crashed at exit (SIGSEGV). The room is now reserved before HDF5
    writes, so ENOSPC comes from the reservation."""
    script = tmp_path / "fill.py"
    script.write_text(_FILL_AFTER_CHECK)
    dst = os.path.join(small_fs, "out")
    r = subprocess.run([sys.executable, str(script), "convert", "imagefolder", "hdf5", big_source, dst, "--workers",
                        str(workers), "--encode", "raw"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(err) == 1 and err[0].startswith("packer: error: disk full: no space left on device while writing ")
    assert os.listdir(small_fs) == []


@pytest.mark.parametrize("workers", [2, 3])
def test_hdf5_disk_full_with_busy_workers_exits(small_fs, tmp_path, workers):  # noqa: F811
    """The disk fills while workers still hold answers bigger than a pipe's buffer (chunks of raw
    images): the conversion prints its one line, removes the partial output and exits (the workers
    blocked in their send, and the exit waited on them forever)."""
    src = str(tmp_path / "many")
    make_folder(src, {c: [(f"{i}.png", 256, 256) for i in range(100)] for c in ("a", "b")})
    dst = os.path.join(small_fs, "out")
    r = subprocess.run([sys.executable, "-m", "packer", "convert", "imagefolder", "hdf5", src, dst, "--workers",
                        str(workers), "--encode", "raw", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(err) == 1 and err[0].startswith("packer: error: disk full: no space left on device while writing ")
    assert os.listdir(small_fs) == []
