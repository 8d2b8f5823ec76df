"""Data never lost or wrong with exit status 0: a destination never destroys its source, one
conversion owns a destination, and a reader only reads the dataset it opened."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from packer.cli import main
from packer.description.registry import format_names
from packer.errors import DestinationBusyError, SourceError
from packer.files.filesystem import check_destination, claim_destination, sibling_path
from tests.helpers import make_folder, pack
from tests.test_hostile import big_source, small_fs  # noqa: F401  (fixtures: a 24-image source, a 2 MB tmpfs)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = format_names()


def _src(tmp_path, name="src", n=3):
    root = str(tmp_path / name)
    make_folder(root, {"a": [(f"a{i}.jpg", 24, 24) for i in range(n)], "b": [(f"b{i}.png", 20, 28) for i in range(n)]})
    return root


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# -- a destination that is, contains or lies inside the source ---------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("where", ["same", "same-slash", "same-dotdot", "parent", "inside", "symlink-to-src",
                                   "symlink-parent"])
def test_destination_overlapping_source_is_refused(tmp_path, capsys, fmt, where):
    src = _src(tmp_path)
    before = _files(str(tmp_path))
    os.symlink(src, tmp_path / "link")
    dst = {
        "same": src, "same-slash": src + "/", "same-dotdot": os.path.join(src, "a", ".."),
        "parent": str(tmp_path), "inside": os.path.join(src, "packed"), "symlink-to-src": str(tmp_path / "link"),
        "symlink-parent": str(tmp_path / "link" / "a"),
    }[where]
    assert main(["convert", "imagefolder", fmt, src, dst, "--overwrite", "--resize", "none"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "source" in err[0] and "Traceback" not in err[0]
    assert _files(str(tmp_path)) == before  # nothing deleted, nothing written


@pytest.mark.parametrize("dst_kind", ["lmdb", "imagefolder"])
def test_packed_source_overlapping_destination_is_refused(tmp_path, capsys, dst_kind):
    src = _src(tmp_path)
    packed = str(tmp_path / "p" / "packed")
    pack(src, packed, "tar")
    before = _files(str(tmp_path))
    for dst in (packed, str(tmp_path / "p"), os.path.join(packed, "x")):
        assert main(["convert", "tar", dst_kind, packed, dst, "--overwrite"]) == 1
        assert "source" in capsys.readouterr().err
    assert _files(str(tmp_path)) == before


def test_check_destination_by_identity_bind_or_hardlinked_path(tmp_path):
    src = _src(tmp_path)
    # Same folder reached through a different spelling that realpath cannot see through: a
    # second hard link is impossible for folders, so use the inode comparison on a symlinked
    # grandparent instead (resolved) and on the folder itself.
    check_destination(src, str(tmp_path / "elsewhere"))  # disjoint: fine
    with pytest.raises(SourceError, match="is the source"):
        check_destination(src, os.path.join(str(tmp_path), ".", "src"))
    with pytest.raises(SourceError, match="inside the destination"):
        check_destination(os.path.join(src, "a"), src)


# -- one conversion owns a destination ---------------------------------------------------------
_HOLDER = textwrap.dedent("""
    import sys, time
    from packer.files.filesystem import claim_destination
    with claim_destination(sys.argv[1]):
        print("claimed", flush=True)
        time.sleep(60)
""")


def _hold(dst):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, dst], stdout=subprocess.PIPE, cwd=ROOT)
    assert p.stdout.readline().strip() == b"claimed"
    return p


@pytest.mark.parametrize("fmt", FORMATS)
def test_second_conversion_to_a_claimed_destination_fails_at_once(tmp_path, capsys, fmt):
    src = _src(tmp_path)
    dst = str(tmp_path / "out")
    holder = _hold(dst)
    try:
        t0 = time.monotonic()
        assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "--workers", "1"]) == 1
        assert time.monotonic() - t0 < 5
        err = capsys.readouterr().err.strip()
        assert "being written by another conversion" in err and f"pid {holder.pid}" in err and len(err.splitlines()) == 1
        assert not os.path.exists(dst)
    finally:
        holder.kill()
        holder.wait()
    # The killed holder's claim does not block the next run.
    assert os.path.exists(sibling_path(dst, "lock"))
    assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "--workers", "1"]) == 0
    assert not os.path.exists(sibling_path(dst, "lock"))


def test_stale_claim_of_a_killed_conversion_does_not_block_resume(tmp_path):
    from packer.datasets import open_dataset
    from packer.files.journal import JOURNAL_NAME
    from tools.faultlib import make_source

    src = make_source(str(tmp_path / "src"), n=160)
    dst = str(tmp_path / "out")
    args = ["convert", "imagefolder", "tar", src, dst, "--resize", "shorter:200", "--shard-samples", "4",
            "--workers", "1"]
    p = subprocess.Popen([sys.executable, "-m", "packer", *args], cwd=ROOT, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    journal = os.path.join(sibling_path(dst, "tmp"), JOURNAL_NAME)
    while p.poll() is None and not os.path.exists(journal):
        time.sleep(0.002)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    if p.returncode == 0:
        pytest.skip("the conversion finished before it could be killed")
    assert os.path.exists(sibling_path(dst, "lock"))  # the killed run's claim file is still there
    assert main([*args, "--resume"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 160


def test_claim_is_exclusive_between_processes_and_reentrant_within_one(tmp_path):
    dst = str(tmp_path / "d")
    with claim_destination(dst):
        with claim_destination(dst):  # the same process: fine
            pass
        assert os.path.exists(sibling_path(dst, "lock"))
        code = f"from packer.files.filesystem import claim_destination\nwith claim_destination({dst!r}): pass"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 1 and "DestinationBusyError" in r.stderr and f"pid {os.getpid()}" in r.stderr
    assert not os.path.exists(sibling_path(dst, "lock"))


def test_claim_error_names_owner_and_survives_pickling(tmp_path):
    import pickle

    e = DestinationBusyError("busy", path="/x")
    f = pickle.loads(pickle.dumps(e))
    assert str(f) == "busy" and f.path == "/x"


@pytest.mark.parametrize("fmt", FORMATS)
def test_concurrent_conversions_never_publish_a_mismatched_dataset(tmp_path, fmt):
    """Two real CLI runs at once: each exits 0 or fails naming the other; what is published verifies."""
    src = _src(tmp_path, n=30)
    dst = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "packer", "convert", "imagefolder", fmt, src, dst, "--resize", "none",
           "--overwrite", "--workers", "1", "--shard-samples", "7"]
    if fmt in ("lmdb", "hdf5"):
        cmd = cmd[:-2]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [(p.wait(), p.stderr.read()) for p in procs]
    assert any(rc == 0 for rc, _ in outs)
    for rc, err in outs:
        assert rc == 0 or (rc == 1 and "being written by another conversion" in err), err
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# -- a reader reads only the dataset it opened ---------------------------------------------------
def _two_datasets(tmp_path, fmt):
    """``dst`` packed from one source, and a second conversion of another source ready to replace it."""
    a = str(tmp_path / "a")
    b = str(tmp_path / "b")
    make_folder(a, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]}, seed=1)
    make_folder(b, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]}, seed=2)
    dst = str(tmp_path / "out")
    pack(a, dst, fmt, encode="png", shuffle=False)
    return dst, lambda: pack(b, dst, fmt, encode="png", shuffle=False, overwrite=True)


#: Every format, the slow ones (about 10 s each: workers wait for the overwrite) in the slow suite.
_LMDB_FAST = [f if f == "lmdb" else pytest.param(f, marks=pytest.mark.slow) for f in FORMATS]


@pytest.mark.parametrize("fmt", _LMDB_FAST)
def test_overwrite_under_an_open_reader_fails_clearly_in_new_workers(tmp_path, fmt):
    import torch

    from packer.datasets import open_dataset
    from packer.errors import DatasetChangedError

    dst, replace = _two_datasets(tmp_path, fmt)
    ds = open_dataset(dst, output="numpy")
    old = [ds[i][0].copy() for i in range(len(ds))]
    replace()
    new = open_dataset(dst, output="numpy")
    assert any(not (new[i][0] == old[i]).all() for i in range(len(ds)))
    # This process's open handles still read the dataset it opened, never the new one.
    assert all((ds[i][0] == old[i]).all() for i in range(len(ds)))
    # A non-persistent worker opens the path again: it must refuse, not read the new dataset.
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, persistent_workers=False)
    with pytest.raises(DatasetChangedError, match="after this reader opened it"):
        list(loader)
    ds.close()  # and reopening in this process is refused too
    with pytest.raises(DatasetChangedError):
        ds[0]


@pytest.mark.parametrize("fmt", _LMDB_FAST)
def test_overwrite_under_a_streaming_dataset_fails_clearly(tmp_path, fmt):
    import torch

    from packer.datasets import StreamingDataset
    from packer.errors import DatasetChangedError

    dst, replace = _two_datasets(tmp_path, fmt)
    sds = StreamingDataset(dst, shuffle=False)
    replace()
    loader = torch.utils.data.DataLoader(sds, batch_size=4, num_workers=1)
    with pytest.raises(DatasetChangedError):
        list(loader)


@pytest.mark.parametrize("fmt", FORMATS)
def test_payload_file_from_another_conversion_is_refused_at_open(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst, _ = _two_datasets(tmp_path, fmt)
    other = str(tmp_path / "other")
    make_folder(str(tmp_path / "c"), {"x": [(f"{i}.png", 20, 24) for i in range(5)]}, seed=3)
    pack(str(tmp_path / "c"), other, fmt, encode="png")
    payload = open_dataset(dst).manifest.files[0].name
    shutil.copyfile(os.path.join(other, payload), os.path.join(dst, payload))
    with pytest.raises(CorruptDataError, match="the manifest says"):
        open_dataset(dst)[0]


# -- only regular files inside the dataset are read -----------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_manifest_file_names_outside_the_dataset_are_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest, write_manifest

    dst, _ = _two_datasets(tmp_path, fmt)
    m = read_manifest(dst)
    name = m.files[0].name
    shutil.copyfile(os.path.join(dst, name), tmp_path / name)
    for bad in (f"../{name}", str(tmp_path / name), "", "..", "a\\b"):
        m.files[0].name = bad
        write_manifest(dst, m)
        r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1 and "not a plain file name" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_symlinked_payload_is_refused(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst, _ = _two_datasets(tmp_path, fmt)
    name = open_dataset(dst).manifest.files[0].name
    os.rename(os.path.join(dst, name), tmp_path / "moved")
    os.symlink(tmp_path / "moved", os.path.join(dst, name))
    with pytest.raises(CorruptDataError, match="regular file|symlink"):
        open_dataset(dst)[0]
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "not a regular file" in r.stdout + r.stderr


@pytest.mark.parametrize("what", ["manifest", "index"])
def test_fifo_in_place_of_a_packed_file_does_not_hang(tmp_path, what):
    fmt = "tfrecord" if what == "index" else "lmdb"
    dst, _ = _two_datasets(tmp_path, fmt)
    name = "manifest.json" if what == "manifest" else "shard-000000.idx"
    if what == "index":
        assert name in os.listdir(dst)
    os.remove(os.path.join(dst, name))
    os.mkfifo(os.path.join(dst, name))
    for cmd in (["info", dst], ["verify", dst]) if what == "manifest" else (["verify", dst],):
        r = subprocess.run([sys.executable, "-m", "packer", *cmd], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "regular file" in out and "Traceback" not in out, out


@pytest.mark.parametrize("classes", [["a", "a"], "ab", {"a": 0}, [1, 2], None])
def test_malformed_class_lists_are_refused(tmp_path, classes):
    import json

    from packer.description.manifest import read_manifest
    from packer.errors import ManifestError

    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["classes"] = classes
    json.dump(d, open(path, "w"))
    with pytest.raises(ManifestError, match="classes|class"):
        read_manifest(dst)


@pytest.mark.parametrize("literal", ["-1", "1e400", "1" + "0" * 5000, '"12"', "true", str(2**63), "2.0"],
                         ids=["negative", "1e400", "5000-digits", "string", "bool", "2^63", "float"])
def test_malformed_sample_counts_are_refused(tmp_path, literal):
    import json

    dst, _ = _two_datasets(tmp_path, "lmdb")
    path = os.path.join(dst, "manifest.json")
    text = open(path).read()
    d = json.loads(text)
    d["num_samples"] = "__N__"
    open(path, "w").write(json.dumps(d).replace('"__N__"', literal))
    r = subprocess.run([sys.executable, "-m", "packer", "info", dst], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and ("num_samples" in r.stderr or "digits" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_deeply_nested_manifest_is_refused(tmp_path):
    dst, _ = _two_datasets(tmp_path, "lmdb")
    open(os.path.join(dst, "manifest.json"), "w").write("[" * 100_000 + "]" * 100_000)
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "nested too deeply" in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- empty payloads and JPEGs libjpeg only warns about --------------------------------------------
def _jpeg(seed=0, size=64):
    import cv2
    import numpy as np

    from tests.helpers import draw

    ok, buf = cv2.imencode(".jpg", draw(np.random.default_rng(seed), size, size), [cv2.IMWRITE_JPEG_QUALITY, 90])
    return buf.tobytes()


def _damaged_jpegs():
    good = _jpeg(size=96)
    sos = good.find(b"\xff\xda")
    garbled = bytearray(good)
    for k in range(sos + 40, min(len(good) - 4, sos + 140), 7):
        garbled[k] ^= 0x5A
    return {"truncated-eoi": good[: len(good) // 2] + b"\xff\xd9", "garbled": bytes(garbled)}


def _wds_shards(root, members):
    """A tar shard as webdataset writes them: KEY.jpg + KEY.cls per sample."""
    import io
    import tarfile

    os.makedirs(root, exist_ok=True)
    with tarfile.open(os.path.join(root, "shard-000000.tar"), "w") as tf:
        for key, data in members:
            for ext, d in (("jpg", data), ("cls", b"1")):
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(d)
                tf.addfile(ti, io.BytesIO(d))
    return root


@pytest.mark.parametrize("kind", ["truncated-eoi", "garbled"])
def test_jpegs_libjpeg_only_warns_about_are_skipped_with_the_warning(tmp_path, kind):
    import cv2
    import numpy as np

    bad = _damaged_jpegs()[kind]
    assert cv2.imdecode(np.frombuffer(bad, np.uint8), cv2.IMREAD_COLOR) is not None  # OpenCV says nothing
    src = str(tmp_path / "src")
    make_folder(src, {"a": [("ok.png", 20, 20)]})
    open(os.path.join(src, "a", "bad.jpg"), "wb").write(bad)
    for workers in (1, 2):
        dst = str(tmp_path / f"out{workers}")
        rep = pack(src, dst, "lmdb", resize="shorter:16", workers=workers)
        assert rep.manifest.num_samples == 1
        [skip] = rep.manifest.skipped
        assert skip.path.endswith("bad.jpg") and "Corrupt JPEG data" in skip.reason
    assert main(["convert", "imagefolder", "lmdb", src, str(tmp_path / "kept"), "--keep-damaged-jpeg", "-q"]) == 0
    from packer.datasets import open_dataset
    assert len(open_dataset(str(tmp_path / "kept"))) == 2


@pytest.mark.parametrize("dst_kind", ["lmdb", "tar", "imagefolder"])
def test_empty_and_damaged_foreign_payloads_are_skipped_not_copied(tmp_path, capsys, dst_kind):
    good = _jpeg()
    shards = _wds_shards(str(tmp_path / "shards"), [("a", good), ("b", b""), ("c", _damaged_jpegs()["garbled"]),
                                                     ("d", good)])
    dst = str(tmp_path / "out")
    assert main(["convert", "tar", dst_kind, shards, dst]) == 3
    out = capsys.readouterr()
    assert "b: empty image payload (0 bytes)" in out.out + out.err and "Corrupt JPEG data" in out.out + out.err
    if dst_kind == "imagefolder":
        files = [os.path.join(d, f) for d, _, fs in os.walk(dst) for f in fs]
        assert len(files) == 2 and all(os.path.getsize(f) > 0 for f in files)
    else:
        from packer.datasets import open_dataset
        ds = open_dataset(dst)
        assert len(ds) == 2
        assert [ds.read_record(i).height for i in range(2)] == [64, 64]  # sizes from the header, not 0x0


def test_empty_payload_in_a_packed_dataset_is_an_error_at_read_and_in_verify(tmp_path):
    """A forged record with a 0-byte payload (its CRC32C is 0, so the checksum agrees)."""
    from packer.converters.base import WriterOptions
    from packer.datasets import open_dataset
    from packer.description.manifest import Manifest, file_sha256, write_manifest
    from packer.description.registry import writer_class
    from packer.errors import CorruptDataError
    from packer.images.imageproc import ProcessedImage

    dst = str(tmp_path / "forged")
    os.makedirs(dst)
    w = writer_class("tar")(dst, WriterOptions())
    w.begin({"classes": ["a"], "processing": {}})
    w.add(0, "k0", 0, ProcessedImage("jpeg", _jpeg(), 64, 64))
    w.add(1, "k1", 0, ProcessedImage("jpeg", b"", 64, 64))
    files, layout = w.close()
    write_manifest(dst, Manifest("tar", 2, ["a"], {"encoding": "jpeg:90"}, files, layout=layout))
    assert all(file_sha256(os.path.join(dst, f.name)) == f.sha256 for f in files)
    ds = open_dataset(dst)
    ds[0]
    with pytest.raises(CorruptDataError, match="empty image payload.*sample 1"):
        ds[1]
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "empty image payload" in r.stdout + r.stderr and "Traceback" not in r.stderr


# -- integrity binds content to its place -----------------------------------------------------------
def _raw_pair(tmp_path, fmt, **kw):
    """Two conversions of different pixels with the same names and sizes (raw: equal file sizes)."""
    outs = []
    for seed in (1, 2):
        src = str(tmp_path / f"s{seed}")
        make_folder(src, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]},
                    seed=seed)
        outs.append(str(tmp_path / f"o{seed}"))
        pack(src, outs[-1], fmt, encode="raw", shuffle=False, **kw)
    return outs


def _read_all(path):
    from packer.datasets import open_dataset

    ds = open_dataset(path)
    for i in range(len(ds)):
        ds[i]


@pytest.mark.parametrize("fmt", FORMATS)
def test_payload_file_of_equal_size_from_another_conversion_is_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError

    a, b = _raw_pair(tmp_path, fmt)
    for f in read_manifest(a).files:  # every file of b, under a's names: sizes all agree
        assert os.path.getsize(os.path.join(a, f.name)) == os.path.getsize(os.path.join(b, f.name))
        shutil.copyfile(os.path.join(b, f.name), os.path.join(a, f.name))
    with pytest.raises(CorruptDataError, match="another place|another file"):
        _read_all(a)


@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_shards_of_equal_size_swapped_on_disk_are_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError

    a, _ = _raw_pair(tmp_path, fmt, writer={"shard_samples": 6})
    m = read_manifest(a)
    pairs = {}
    for f in m.files:
        if f.name.startswith("shard-"):
            stem, ext = f.name.split(".", 1)
            pairs.setdefault(ext, []).append(f.name)
    for names in pairs.values():  # swap shard 0 and 1 with their index files, as a careless copy would
        x, y = (os.path.join(a, n) for n in names[:2])
        assert os.path.getsize(x) == os.path.getsize(y)
        os.rename(x, x + ".tmp")
        os.rename(y, x)
        os.rename(x + ".tmp", y)
    with pytest.raises(CorruptDataError, match="another place|first sample|index"):
        _read_all(a)


def test_lmdb_record_reached_through_a_wrong_pointer_is_refused(tmp_path):
    """What a flipped B-tree or overflow page number does: key i leads to sample j's intact record."""
    import lmdb

    from packer.errors import CorruptDataError

    a, _ = _raw_pair(tmp_path, "lmdb")
    env = lmdb.open(a, subdir=True, lock=False)
    with env.begin(write=True) as txn:
        other = txn.get(b"%010d" % 7)
        txn.put(b"%010d" % 3, other)
    env.close()
    from tests.helpers import forge_manifest_sizes

    forge_manifest_sizes(a)
    from packer.datasets import open_dataset

    ds = open_dataset(a)
    ds[2]
    with pytest.raises(CorruptDataError, match="another place.*sample 3"):
        ds[3]


def _table_pair(tmp_path, fmt):
    """Two conversions of one folder shuffled with different seeds: files of equal size (raw
    pixels), sample tables holding the same keys and labels in other orders."""
    src = str(tmp_path / "src")
    make_folder(src, {c: [(f"{c}{i}.png", 8, 8) for i in range(8)] for c in "abc"})
    outs = [str(tmp_path / f"o{seed}") for seed in (1, 2)]
    for seed, out in zip((1, 2), outs):
        pack(src, out, fmt, encode="raw", seed=seed)
    return outs


def _swap_table(tmp_path, fmt, how):
    """Dataset ``a`` with a sample table that is not its own (same size), and ``a``'s true
    labels and keys: ``foreign`` copies another conversion's table in; ``altered`` writes the
    table again with two labels changed and every checksum recomputed."""
    from packer.datasets import open_dataset
    from packer.description.samples import TABLE_NAME, build_table

    a, b = _table_pair(tmp_path, fmt)
    with open_dataset(a) as ds:
        truth = (list(ds.targets), list(ds.keys))
    table = os.path.join(a, TABLE_NAME)
    if how == "foreign":
        shutil.copyfile(os.path.join(b, TABLE_NAME), table)
    else:
        labels, keys = truth
        build_table(table, "class", iter([(k, (lab + 1) % 3 if i < 2 else lab)
                                          for i, (k, lab) in enumerate(zip(keys, labels))]))
    assert os.path.getsize(table) == os.path.getsize(os.path.join(b, TABLE_NAME))
    return a, truth


@pytest.mark.parametrize("how", ["foreign", "altered"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_table_that_is_not_the_datasets_own_is_refused(tmp_path, fmt, how):
    """Labels and keys come from the sample table: one from another conversion (or rewritten with
    valid checksums) is refused by every reader and by verify, one line naming the file; before,
    every format read it, ds.targets and ds.keys wrong."""
    from packer.datasets import StreamingDataset, open_dataset
    from packer.errors import CorruptDataError
    from packer.operations.verify import verify_dataset

    a, truth = _swap_table(tmp_path, fmt, how)
    table = os.path.join(a, "samples.table")
    reads = {
        "targets": lambda: open_dataset(a).targets,
        "keys": lambda: open_dataset(a).keys,
        "key field": lambda: open_dataset(a, fields=("image", "key"))[0],
        "streaming": lambda: list(StreamingDataset(a, shuffle=False, fields=("label", "key"))),
    }
    for what, read in reads.items():
        with pytest.raises(CorruptDataError, match="not this dataset's") as e:
            read()
        assert table in str(e.value) and "\n" not in str(e.value), what
    with open_dataset(a) as ds:  # labels from the payload files are right and still read
        assert [ds[i][1] for i in range(len(ds))] == truth[0]
    rep = verify_dataset(a)
    assert not rep.ok and any(table in p and "not this dataset's" in p for p in rep.problems), rep.problems
    r = subprocess.run([sys.executable, "-m", "packer", "verify", a], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "samples.table" in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["", "XYZ", "0123456789ABCDEF", 7])
def test_a_sample_table_id_that_is_not_one_is_refused_with_the_manifest(tmp_path, capsys, bad):
    """The table's id is 16 lowercase hex digits; a manifest holding anything else is one line
    naming the table or the field. Without one (as written before tables had an id) it opens."""
    import json

    a, _ = _table_pair(tmp_path, "tar")
    with open(os.path.join(a, "manifest.json")) as f:
        m = json.load(f)
    assert len(m["files"][-1]["id"]) == 16 and m["files"][-1]["name"] == "samples.table"
    m["files"][-1]["id"] = bad
    with open(os.path.join(a, "manifest.json"), "w") as f:
        json.dump(m, f)
    rc = main(["info", a])
    err = capsys.readouterr().err.strip().splitlines()
    if bad == "":  # as written before tables had an id: opens, the table checked by its SHA-256
        assert rc == 0
        from packer.datasets import open_dataset

        assert len(open_dataset(a).keys) == 24
    else:
        assert rc == 1 and len(err) == 1 and ("'samples.table' has no valid id" in err[0] or "files[2].id" in err[0])


@pytest.mark.parametrize(("fmt", "which"), [(f, "table") for f in FORMATS] + [(f, "payload") for f in FORMATS]
                         + [("tar", "index")])
def test_merge_refuses_a_part_file_from_another_conversion_before_copying(tmp_path, capsys, fmt, which):
    """merge checks each part's sample table and index files by SHA-256, its payload files by size
    and identity, before anything is copied: another conversion's file of the same size is refused
    naming the part and the file (before, a swapped table's keys were merged into a dataset that
    verified)."""
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError
    from packer.operations.merge import merge

    a, b = _table_pair(tmp_path, fmt)
    files = read_manifest(a).files
    name = {"table": files[-1].name, "payload": files[0].name, "index": files[1].name}[which]
    with open(os.path.join(a, name), "rb") as f, open(os.path.join(b, name), "rb") as g:
        ours, theirs = f.read(), g.read()
    assert ours != theirs and len(ours) == len(theirs)
    with open(os.path.join(a, name), "wb") as f:
        f.write(theirs)
    m = str(tmp_path / "m")
    with pytest.raises(CorruptDataError, match=f"part {a}: {name} differs from its manifest entry"):
        merge([b, a], m)
    assert not os.path.exists(m) and not os.path.exists(os.path.join(tmp_path, ".m.packer-tmp"))
    assert main(["merge", m, b, a]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"part {a}: {name}" in err[0] and "Traceback" not in err[0], err


# -- options a format does not take are refused, never silently ignored ------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_writer_options_a_format_does_not_take_are_refused(tmp_path, capsys, fmt):
    from packer.description.registry import get_format

    src = _src(tmp_path)
    takes = get_format(fmt).options
    for flag, field, value in (("--shard-size", "shard_bytes", "1MB"), ("--shard-samples", "shard_samples", "3"),
                               ("--gzip", "gzip", None), ("--checkpoint-samples", "checkpoint_samples", "3")):
        argv = ["convert", "imagefolder", fmt, src, str(tmp_path / f"o-{field}"), "--resize", "none", flag,
                *([value] if value else [])]
        rc = main(argv)
        err = capsys.readouterr().err
        if field in takes:
            assert rc == 0, err
        else:
            assert rc == 2 and f"{flag} applies to" in err and len(err.strip().splitlines()) == 1
            with pytest.raises(ValueError, match=f"{field} does not apply to {fmt}"):
                pack(src, str(tmp_path / "api"), fmt, writer={field: 3 if value else True})


# -- skipping corrupt samples in long runs ------------------------------------------------------------
def _damaged_tar(tmp_path, n, bad):
    """A raw tar dataset of ``n`` samples whose first ``bad`` samples fail their checksum."""
    from packer.layouts.tar import unpack_index
    from tests.helpers import forge_manifest_sizes

    src = str(tmp_path / "src")
    make_folder(src, {"a": [(f"{i:05d}.png", 2, 2) for i in range(n)]})
    dst = str(tmp_path / "out")
    pack(src, dst, "tar", encode="raw", shuffle=False)
    idx = os.path.join(dst, "shard-000000.pkidx")
    _, entries, _ = unpack_index(open(idx, "rb").read(), idx)
    with open(os.path.join(dst, "shard-000000.tar"), "r+b") as f:
        for e in entries[:bad]:
            f.seek(int(e["offset"]) + int(e["size"]) - 1)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
    forge_manifest_sizes(dst)
    return dst


def test_skips_are_counted_across_workers_and_never_exhaust_over_epochs(tmp_path):
    import torch

    from packer.datasets import open_dataset
    from packer.datasets.shm.skips import SkippedSampleWarning

    dst = _damaged_tar(tmp_path, 4, 1)
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with pytest.warns(SkippedSampleWarning, match="sample 0"):
        ds[0]
    for _ in range(10):  # one bad sample in four, for more epochs than the dataset has samples
        for i in range(len(ds)):
            ds[i]
    assert ds.errors == 11
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list)
    for _ in range(3):
        assert sum(len(b) for b in loader) == 4
    assert ds.errors == 14  # counted in the workers, seen here


def test_a_thousand_consecutive_bad_samples_are_skipped_without_recursion(tmp_path):
    import warnings

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst = _damaged_tar(tmp_path, 1100, 1050)
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, label = ds[0]  # sample 1050 is the first good one
        assert ds.errors == 1050
    all_bad = _damaged_tar(tmp_path / "b", 5, 5)
    ds = open_dataset(all_bad, on_error="skip", output="numpy")
    with warnings.catch_warnings(), pytest.raises(CorruptDataError, match="every sample"):
        warnings.simplefilter("ignore")
        ds[2]



@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_file_that_fails_its_open_check_is_opened_once_per_process(tmp_path, fmt, monkeypatch):
    """on_error="skip" over a dataset whose payload file was replaced by another conversion's: the
    open check fails, and later samples raise the same error without opening the file again (it
    was opened and its index read once per sample: O(n^2) per epoch)."""
    import warnings

    from packer.datasets import open_dataset
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError
    from packer.storage import datasetdir

    dst, _ = _two_datasets(tmp_path, fmt)
    _two_datasets(tmp_path / "b", fmt)[1]()  # another conversion, its files in tmp_path/b/out
    data = [e.name for e in read_manifest(dst).files if e.name.endswith((".h5", ".mdb", ".tar", ".tfrecord"))]
    for name in data:
        shutil.copyfile(os.path.join(tmp_path, "b", "out", name), os.path.join(dst, name))
    opened = []  # every open of a dataset file, through the reader's one checked path
    real_open = datasetdir.open_regular
    monkeypatch.setattr(datasetdir, "open_regular", lambda name, *a, **k: opened.append(name) or real_open(name, *a, **k))
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # two epochs
            for i in range(len(ds)):
                with pytest.raises(CorruptDataError, match="every sample"):
                    ds[i]
    assert len(ds) == 12 and ds.errors == (0 if fmt == "hdf5" else 12)  # the first read counts, no later one
    assert len([n for n in opened if n in data]) <= len(data), opened

def test_corrupt_data_error_keeps_its_fields_across_a_dataloader_worker(tmp_path):
    import torch

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst = _damaged_tar(tmp_path, 4, 4)
    loader = torch.utils.data.DataLoader(open_dataset(dst), batch_size=1, num_workers=1)
    with pytest.raises(CorruptDataError) as info:
        next(iter(loader))
    e = info.value
    assert e.path == os.path.join(dst, "shard-000000.tar") and e.sample == 0 and isinstance(e.offset, int)


@pytest.mark.parametrize("bad", [1.0, "a", slice(0, 2), None, True])
def test_non_integer_indices_are_a_clear_type_error(tmp_path, bad):
    from packer.datasets import open_dataset

    dst, _ = _two_datasets(tmp_path, "lmdb")
    ds = open_dataset(dst)
    with pytest.raises(TypeError, match="indices must be integers"):
        ds[bad]
    import numpy as np

    assert (ds[np.int64(1)][0] == ds[1][0]).all() and (ds[-1][0] == ds[len(ds) - 1][0]).all()
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_home_relative_paths_are_expanded(tmp_path, monkeypatch):
    from packer.datasets import StreamingDataset, open_dataset

    dst, _ = _two_datasets(tmp_path, "tar")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert len(open_dataset("~/out")) == len(StreamingDataset("~/out", shuffle=False)) == 12
    assert open_dataset("~/out").root == dst


# -- bounded work for any input ---------------------------------------------------------------------
def test_upscale_output_is_bounded_by_max_pixels_before_decoding(tmp_path):
    import cv2
    import numpy as np

    src = str(tmp_path / "src")
    make_folder(src, {"a": [("ok.png", 20, 20)]})
    ok, buf = cv2.imencode(".png", np.zeros((1, 3000, 3), np.uint8))
    open(os.path.join(src, "a", "thin.png"), "wb").write(buf.tobytes())
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:256"), upscale=True,
                                                    encoding=parse_encoding("png"), max_pixels=10_000_000))
    rep = convert_imagefolder(src, str(tmp_path / "out"), "tar", opts)
    [skip] = rep.manifest.skipped
    assert skip.path.endswith("thin.png") and "768000x256" in skip.reason and "--max-pixels" in skip.reason
    assert rep.manifest.num_samples == 1


@pytest.mark.parametrize("label", [b"300000000", b"9223372036854775808", b"-5"])
def test_huge_or_negative_foreign_labels_are_one_clear_error(tmp_path, label):
    import io
    import tarfile

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    root = tmp_path / "shards"
    root.mkdir()
    with tarfile.open(root / "a-000000.tar", "w") as tf:
        for name, data in (("k.jpg", _jpeg()), ("k.cls", label)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    with pytest.raises(CorruptDataError, match="label|classes|class number"):
        open_dataset(str(root), format="tar")


def _malloc_outcomes(_):
    from packer.datasets.shm import worker_memory

    return [worker_memory.tune_worker_malloc(), worker_memory.tune_worker_malloc()]


class _Probe:
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return _malloc_outcomes(i)


def _fail_apply(_):
    from packer.datasets.shm import worker_memory

    worker_memory._apply = lambda: False


def test_malloc_tuning_reports_a_failure_every_time_not_only_the_first():
    import torch

    loader = torch.utils.data.DataLoader(_Probe(), batch_size=None, num_workers=1, worker_init_fn=_fail_apply,
                                         multiprocessing_context="fork")
    assert next(iter(loader)) == [False, False]


@pytest.mark.parametrize("name", ["train.tfrecords", "train.tfr", "train-00000-of-01024"])
def test_other_tools_tfrecord_names_read_every_sample(tmp_path, name):
    from packer.datasets import StreamingDataset, open_dataset

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copyfile(os.path.join(dst, "shard-000000.tfrecord"), foreign / name)
    where = str(foreign / name) if "-of-" in name else str(foreign)
    ds = open_dataset(where, format="tfrecord")
    assert len(ds) == 12 and all(ds[i][1] in (0, 1) for i in range(12))
    assert len(list(StreamingDataset(where, format="tfrecord", shuffle=False))) == 12


@pytest.mark.parametrize("kind", ["imagefolder", "foreign-lmdb", "foreign-tar", "unfinished"])
def test_a_directory_without_manifest_is_told_for_what_it_is(tmp_path, capsys, kind):
    import io
    import tarfile

    import lmdb

    from packer.datasets import open_dataset
    from packer.errors import UnfinishedDatasetError

    d = tmp_path / "d"
    if kind == "imagefolder":
        make_folder(str(d), {"a": [("x.png", 8, 8)]})
        want = "an image folder"
    elif kind == "foreign-lmdb":
        env = lmdb.open(str(d), lock=False, map_size=1 << 20)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        env.close()
        want = "not written by packer"
    elif kind == "foreign-tar":
        d.mkdir()
        with tarfile.open(d / "x.tar", "w") as tf:
            ti = tarfile.TarInfo("k.cls")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"1"))
        want = "format='tar'"
    else:
        dst, _ = _two_datasets(tmp_path, "lmdb")
        os.remove(os.path.join(dst, "manifest.json"))
        d = tmp_path / "out"
        want = "did not finish"
    with pytest.raises(UnfinishedDatasetError, match=want):
        open_dataset(str(d))
    for cmd in ("info", "verify"):
        assert main([cmd, str(d)]) == 1
        err = capsys.readouterr().err
        assert want.replace("format='tar'", "format='tar'") in err and len(err.strip().splitlines()) == 1


# -- manifests: every field of the wrong JSON type is one line naming the field --------------------
_NESTED = {
    "processing-string": (lambda d: d.__setitem__("processing", "x"), "processing"),
    "processing.encoding-int": (lambda d: d["processing"].__setitem__("encoding", 5), "processing.encoding"),
    "skipped-string": (lambda d: d.__setitem__("skipped", "x"), "skipped"),
    "skipped-ints": (lambda d: d.__setitem__("skipped", [1, 2]), "skipped[0]"),
    "skipped-path-int": (lambda d: d.__setitem__("skipped", [{"path": 1, "reason": "r"}]), "skipped[0].path"),
    "skipped-empty-object": (lambda d: d.__setitem__("skipped", [{}]), "skipped[0].path"),
    "files-strings": (lambda d: d.__setitem__("files", ["data"]), "files[0]"),
    "files-empty-object": (lambda d: d["files"].__setitem__(0, {}), "files[0].name"),
    "layout-list": (lambda d: d.__setitem__("layout", [1]), "layout"),
    "layout.foreign-string": (lambda d: d["layout"].__setitem__("foreign", "yes"), "layout.foreign"),
    "ignored-string": (lambda d: d.__setitem__("ignored", "x"), "ignored"),
    "ignored.hidden-string": (lambda d: d.__setitem__("ignored", {"hidden": "x"}), "ignored.hidden"),
    "shuffle_seed-string": (lambda d: d.__setitem__("shuffle_seed", "x"), "shuffle_seed"),
    "created_by-list": (lambda d: d.__setitem__("created_by", [1]), "created_by"),
    "unknown-format": (lambda d: d.__setitem__("format", "zarr"), "format 'zarr'"),
}


@pytest.mark.parametrize("case", list(_NESTED))
def test_nested_manifest_fields_of_the_wrong_type_are_one_line_naming_the_field(tmp_path, capsys, case):
    import json

    from packer.datasets import open_dataset
    from packer.errors import ManifestError

    mutate, field = _NESTED[case]
    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    mutate(d)
    json.dump(d, open(path, "w"))
    for cmd in ("info", "verify"):
        assert main([cmd, dst]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and field in err and "manifest.json" in err, err
    with pytest.raises(ManifestError, match=f"manifest.json: .*{field.replace('[', '.').replace(']', '.')}"):
        open_dataset(dst)


def test_manifest_strings_with_lone_surrogate_escapes_are_refused_naming_the_field(tmp_path, capsys):
    """JSON lets "caf\\udce9" stand alone; converting such a dataset failed with a raw
    UnicodeEncodeError. A valid pair (an emoji written as two escapes) is fine."""
    import json

    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["created_by"] = "packer \U0001f600"
    d["classes"][0] = "caf\udce9"
    open(path, "w").write(json.dumps(d))  # ASCII: the emoji as a surrogate pair, the other one alone
    for argv in (["info", dst], ["verify", dst], ["convert", "tar", "lmdb", dst, str(tmp_path / "o")]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "classes[0] holds a lone UTF-16 surrogate" in err, err
    d["classes"][0] = "x"
    open(path, "w").write(json.dumps(d))
    assert main(["info", dst]) == 0 and "\U0001f600" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_count_the_files_cannot_hold_is_refused_at_once(tmp_path, fmt):
    """num_samples of 10^15 (files[] forged to agree): verify used to loop for ever (LMDB, HDF5) or
    try to allocate petabytes (TFRecord)."""
    import json

    dst, _ = _two_datasets(tmp_path, fmt)
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["files"][0]["samples"] += 10**15 - d["num_samples"]
    d["num_samples"] = 10**15
    json.dump(d, open(path, "w"))
    for cmd in ("info", "verify"):
        r = subprocess.run([sys.executable, "-m", "packer", cmd, dst], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "every sample takes at least one byte" in r.stderr, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_count_the_payload_does_not_hold_is_one_problem_in_verify(tmp_path, fmt):
    """num_samples forged to the payload file's byte count (the most the manifest allows): verify
    reported one problem per sample (LMDB) or reopened the file for each of 1.4 million (HDF5)."""
    import json

    dst, _ = _two_datasets(tmp_path, fmt)
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    n = d["files"][0]["bytes"]
    d["files"][0]["samples"] += n - d["num_samples"]
    d["num_samples"] = n
    json.dump(d, open(path, "w"))
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "cannot open" in r.stdout + r.stderr and "more problems" not in r.stdout, r.stdout


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


# -- source names and links ------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_names_that_are_not_utf8_are_skipped_shown_escaped_not_a_crash(tmp_path, capsys, fmt):
    import json

    from packer.datasets import open_dataset

    src = _src(tmp_path, n=2)
    a, root = os.path.join(src, "a").encode(), src.encode()
    os.rename(a + b"/a1.jpg", a + b"/caf\xe9.jpg")
    os.mkdir(a + b"/sub\xff")
    shutil.copyfile(a + b"/a0.jpg", a + b"/sub\xff/in.jpg")
    make_folder(os.path.join(src, "c"), {"x": [("x.png", 8, 8)]})
    os.rename(root + b"/c/x", root + b"/cl\xe9ss")
    os.rmdir(root + b"/c")
    dst = str(tmp_path / "out")
    assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "-q"]) == 3
    out = capsys.readouterr()
    for shown in ("a/caf\\xe9.jpg", "a/sub\\xff", "cl\\xe9ss"):
        assert shown in out.out + out.err and "not valid UTF-8" in out.out + out.err
    raw = open(os.path.join(dst, "manifest.json"), "rb").read()
    m = json.loads(raw.decode("utf-8"))  # valid UTF-8
    assert sorted(s["path"] for s in m["skipped"]) == ["a/caf\\xe9.jpg", "a/sub\\xff", "cl\\xe9ss"]
    assert m["classes"] == ["a", "b"] and len(open_dataset(dst)) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_source_and_destination_inside_a_folder_whose_name_is_not_utf8(tmp_path, fmt):
    """py-lmdb encodes paths as strict UTF-8: an LMDB conversion there failed with a raw codec error."""
    from packer.operations.transcode import convert_dataset
    from packer.operations.verify import verify_dataset

    top = tmp_path / os.fsdecode(b"d\xe9j\xe0")
    dst = os.path.join(top, "out")
    assert pack(_src(top, n=2), dst, fmt).manifest.num_samples == 4
    assert verify_dataset(dst).ok
    assert convert_dataset(dst, os.path.join(top, "again"), fmt, "tar").manifest.num_samples == 4


def test_folder_symlinks_out_of_a_class_folder_are_not_followed(tmp_path):
    from packer.datasets import open_dataset

    src = _src(tmp_path, n=2)
    os.symlink("..", os.path.join(src, "a", "loop"))  # would repack b's images as a's
    os.symlink("../b", os.path.join(src, "a", "other"))
    make_folder(str(tmp_path / "elsewhere"), {"x": [("e.png", 8, 8)]})
    os.symlink(tmp_path / "elsewhere" / "x", os.path.join(src, "a", "ext"))  # followed, as torchvision does
    os.makedirs(os.path.join(src, "a", "sub"))
    os.symlink("..", os.path.join(src, "a", "sub", "up"))  # inside the class, but a loop
    rep = pack(src, str(tmp_path / "out"), "tar")
    keys = sorted(rec.key for rec in map(open_dataset(str(tmp_path / "out")).read_record, range(5)))
    assert rep.manifest.num_samples == 5
    assert keys == ["a/a0.jpg", "a/a1.jpg", "a/ext/e.png", "b/b0.png", "b/b1.png"]
    reasons = {s.path: s.reason for s in rep.manifest.skipped}
    assert "outside this class folder; not followed" in reasons["a/other"]
    assert "symlink loop" in reasons["a/loop"] and "symlink loop" in reasons["a/sub/up"]
    assert all(str(tmp_path) not in r for r in reasons.values())


def test_a_skip_reason_never_shows_the_files_bytes(tmp_path):
    src = _src(tmp_path, n=1)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"PASSWORD=hunter2\n")
    os.symlink(secret, os.path.join(src, "a", "leak.jpg"))
    rep = pack(src, str(tmp_path / "out"), "lmdb")
    [skip] = rep.manifest.skipped
    assert skip.path == "a/leak.jpg" and "not a recognised image format" in skip.reason
    assert "PASSW" not in skip.reason and "PASSW" not in open(os.path.join(tmp_path, "out", "manifest.json")).read()


# -- other tools' files: names, compression ------------------------------------------------------------------
@pytest.mark.parametrize("dst_kind", ["lmdb", "imagefolder"])
def test_foreign_tar_member_names_that_are_not_utf8_are_read(tmp_path, capsys, dst_kind):
    import io
    import tarfile

    from packer.datasets import open_dataset

    root = tmp_path / "shards"
    root.mkdir()
    with tarfile.open(root / "s-000000.tar", "w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tf:
        for key in (b"ok", b"caf\xe9", b"caf\xe8"):
            for ext, data in ((b".jpg", _jpeg()), (b".cls", b"1")):
                ti = tarfile.TarInfo((key + ext).decode("utf-8", "surrogateescape"))
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    dst = str(tmp_path / "out")
    assert main(["convert", "tar", dst_kind, str(root), dst, "-q"]) == 0, capsys.readouterr().err
    if dst_kind == "imagefolder":
        names = sorted(os.listdir(os.path.join(dst, "1")))
        assert len(names) == 3 and "ok.jpg" in names and all(n.encode("utf-8") for n in names)
    else:
        ds = open_dataset(dst)
        assert sorted(ds.read_record(i).key for i in range(3)) == ["caf\ufffd", "caf\ufffd", "ok"]


@pytest.mark.parametrize("length", [2**63 - 1, 2**64 - 1, -16])
def test_tfrecord_index_lengths_beyond_int64_are_one_line(tmp_path, length):
    """A packer .idx (manifest forged to match) with a record length of 2^63-1 overflowed numpy with
    a RuntimeWarning and a negative size in the message; 2^64-1 raised OverflowError."""
    from tests.helpers import forge_manifest_sizes

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    idx = os.path.join(dst, "shard-000000.idx")
    lines = open(idx).read().split("\n")
    lines[1] = f"{lines[1].split()[0]} {length}"
    open(idx, "w").write("\n".join(lines))
    forge_manifest_sizes(dst)
    import warnings

    from packer.operations.verify import verify_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = verify_dataset(dst)
    assert not rep.ok and any("cannot open: TFRecord index" in p for p in rep.problems), rep.problems


@pytest.mark.parametrize("compression", ["ZLIB", "gzip"])
def test_compressed_foreign_tfrecord_is_told_for_what_it_is(tmp_path, capsys, compression):
    import gzip
    import zlib

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    raw = open(os.path.join(dst, "shard-000000.tfrecord"), "rb").read()
    (foreign / "train.tfrecord").write_bytes(zlib.compress(raw) if compression == "ZLIB" else gzip.compress(raw))
    for argv in (["convert", "tfrecord", "lmdb", str(foreign), str(tmp_path / "o")], ["info", str(foreign)]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{compression}-compressed" in err and "checksum" not in err, err


def test_compressed_tar_shards_are_told_for_what_they_are(tmp_path, capsys):
    import gzip

    from packer.datasets import open_dataset

    dst, _ = _two_datasets(tmp_path, "tar")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "a-000000.tar.gz").write_bytes(gzip.compress(open(os.path.join(dst, "shard-000000.tar"), "rb").read()))
    for argv in (["convert", "tar", "lmdb", str(foreign), str(tmp_path / "o")], ["info", str(foreign)]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "compressed tar shards" in err and "gunzip a-000000.tar.gz" in err, err
    with pytest.raises(ValueError, match="compressed tar shards"):
        open_dataset(str(foreign / "a-000000.tar.gz"), format="tar")


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

# -- a torchrun rank that stops answering ------------------------------------------------------------

def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc; zombies excluded)."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(c) for c in f.read().split())
    return {c for c in found if _alive(c)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_torchrun_stopped_rank_fails_the_job_after_the_timeout(tmp_path):
    """SIGSTOP of rank 1 while it converts: with --rank-timeout 3, rank 0 gives up on it after the
    timeout, naming it, instead of waiting for the collective's own timeout; nothing appears at DST."""
    import json

    from packer.conversion.distributed import part_path
    from tests.test_distributed_convert import torchrun_command

    root = str(tmp_path / "src")
    make_folder(root, {c: [(f"{c}{i}.png", 96, 128) for i in range(150)] for c in ("a", "b")})
    dst = str(tmp_path / "dst")
    lock = sibling_path(part_path(dst, 1, 2), "lock")
    cmd, env = torchrun_command(2, "tar", root, dst, "--workers", "1", "--encode", "png", "-q", "--rank-timeout", "3")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = None
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and stopped is None and time.monotonic() < deadline:
            try:
                with open(lock) as f:
                    stopped = json.load(f)["pid"]
                os.kill(stopped, signal.SIGSTOP)
            except (OSError, ValueError, KeyError):
                stopped = None
                time.sleep(0.01)
        assert stopped is not None, "rank 1 never started its part"
        others = _children(proc.pid) - {stopped}
        assert others, "rank 0 is not running"
        deadline = time.monotonic() + 60  # the collective's own timeout would be far longer
        while any(map(_alive, others)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, others)), "rank 0 still waits for the stopped rank"
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert "rank 1 of 2 has not answered for 3 s (stopped or hung" in err
    assert not os.path.exists(dst)


# -- list rows that lead out of the folder they are relative to ------------------------------------
def _list_outside_root(tmp_path):
    """A list whose rows 4 and 5 lead out of --root, to a real image beside it; row 6 goes out and
    back in (``a/../b/b0.png``)."""
    root = _src(tmp_path, "root")
    secret = str(tmp_path / "secret.png")
    shutil.copy(os.path.join(root, "b", "b0.png"), secret)
    rows = ["a/a0.jpg,a", "b/b1.png,b", "../secret.png,a", f"{secret},a", "a/../b/b0.png,b"]
    lst = tmp_path / "root" / "train.csv"
    lst.write_text("path,label\n" + "\n".join(rows) + "\n")
    return root, secret, str(lst)


def test_list_rows_outside_the_root_are_refused_naming_them(tmp_path, capsys):
    from packer.sources.listsource import read_list

    root, secret, lst = _list_outside_root(tmp_path)
    dst = str(tmp_path / "d")
    for extra in ([], ["--root", root]):  # the list's own folder is the root when none is given
        assert main(["convert", "list", "tar", lst, dst, "--workers", "1", "-q", *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "2 rows lie outside" in err[0] and "Traceback" not in err[0], err
        assert err[0].count(lst) == 1 and "line 4: '../secret.png'" in err[0] and f"line 5: '{secret}'" in err[0] and "line 6" not in err[0]
        assert "--allow-outside-root" in err[0] and not os.path.exists(dst)
    assert main(["convert", "list", "tar", lst, dst, "--workers", "1", "-q", "--allow-outside-root"]) == 0
    from packer.description.manifest import read_manifest

    assert read_manifest(dst).num_samples == 5
    src = read_list(lst, allow_outside_root=True)
    assert [p for p, _, _ in src.items][2:] == [secret, secret, os.path.join(root, "b", "b0.png")]
    assert main(["convert", "imagefolder", "tar", root, str(tmp_path / "e"), "--allow-outside-root"]) == 2
    assert "--allow-outside-root applies to list and parquet sources only" in capsys.readouterr().err


def test_list_rows_through_a_symlink_in_the_root_are_followed(tmp_path):
    """The rule is on the path the list writes; a symlink inside the root (the user's own folder)
    is followed wherever it leads, as in an image folder."""
    from packer.pipeline.engine import ConvertOptions
    from packer.sources.listsource import convert_list

    elsewhere = _src(tmp_path, "elsewhere")
    root = tmp_path / "root"
    root.mkdir()
    (root / "more").symlink_to(os.path.join(elsewhere, "a"))
    (root / "l.csv").write_text("path,label\nmore/a0.jpg,a\n")
    report = convert_list(str(root / "l.csv"), str(tmp_path / "d"), "tar", ConvertOptions(workers=1))
    assert report.manifest.num_samples == 1 and not report.skipped


@pytest.mark.parametrize("text, name, why", [
    ('{"path": "a/a0.jpg", "label": "a"}\n{"path": "a/a1.jpg", "label": "a", "path": "../x.png"}\n',
     "l.jsonl", r"l\.jsonl:2: key 'path' appears twice"),
    ('{"path": "a/a0.jpg", "label": "a", "label": "b"}\n', "l.jsonl", r"l\.jsonl:1: key 'label' appears twice"),
    ("path,label,path\na/a0.jpg,a,../x.png\n", "l.csv", r"l\.csv:1: column 'path' appears twice in the header"),
    ("file\tlabel\tnote\tnote\na/a0.jpg\ta\tx\ty\n", "l.tsv", r"l\.tsv:1: column 'note' appears twice"),
])
def test_a_list_key_or_column_named_twice_is_an_error(tmp_path, text, name, why):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, name)
    with open(lst, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(SourceError, match=why):
        read_list(lst)


# -- torchrun ranks and merged parts that see other files ------------------------------------------
def _two_node_torchrun(tmp_path, nodes, *args):
    """Two torchrun launches of one rank each (node ranks 0 and 1, a localhost rendezvous), each
    with its own working folder and SRC argument, as on two machines: [(returncode, stderr)]."""
    from tests.test_distributed_convert import free_port, torchrun_command

    port = str(free_port())
    out = []
    launches = []
    for node, (cwd, src) in enumerate(nodes):
        cmd, env = torchrun_command(1, "tar", src, str(tmp_path / "dst"), "--no-shuffle", "--workers", "1", "-q",
                                    *args)
        at = cmd.index("--nproc_per_node=1") + 1
        cmd = cmd[:at] + ["--nnodes=2", f"--node_rank={node}", "--master_addr=127.0.0.1",
                          f"--master_port={port}"] + cmd[at + 1:]
        launches.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    for p in launches:
        _, err = p.communicate(timeout=240)
        out.append((p.returncode, err))
    return out


@pytest.mark.parametrize("case", ["stale-copy", pytest.param("other-src", marks=pytest.mark.slow)])
def test_torchrun_ranks_that_see_other_files_fail_the_job(tmp_path, case):
    """Rank 1's node holds a stale copy of the source (the same SRC argument, b/b1.png with other
    bytes and time), or rank 1 is given another SRC (an exact copy): every rank exits non-zero
    naming rank 1 and what differs, before any image is converted; nothing is published. Before,
    rank 0 sent only paths and labels: rank 1's images were packed under rank 0's labels, exit 0."""
    for node in ("n0", "n1"):
        os.makedirs(tmp_path / node)
    first = _src(tmp_path / "n0", n=3)  # a0-a2 for rank 0, b0-b2 for rank 1 (no shuffle)
    copy = shutil.copytree(first, tmp_path / "n1" / "src")  # times kept to the nanosecond
    if case == "stale-copy":
        make_folder(copy, {"b": [("b1.png", 28, 20)]}, seed=7)
        st = os.stat(os.path.join(first, "b", "b1.png"))
        os.utime(os.path.join(copy, "b", "b1.png"), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        nodes = [(tmp_path / "n0", "src"), (tmp_path / "n1", "src")]  # one SRC argument, two folders
        want = [os.path.join("src", "b", "b1.png") + " is ", "there, ", "on rank 0"]
    else:
        nodes = [(tmp_path, first), (tmp_path, str(copy))]
        want = [f"it was given SRC {copy}, rank 0 {first}"]
    results = _two_node_torchrun(tmp_path, nodes)
    for rc, err in results:
        assert rc != 0, err
        assert "rank 1 of 2 sees other source files than rank 0: " in err, err
        assert all(w in err for w in want), err
    assert not os.path.exists(tmp_path / "dst")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no part was converted


def test_merge_refuses_parts_that_disagree_about_a_source_file(tmp_path, capsys):
    """Two convert_items parts of the same key made from different copies (b/b1.png with other
    bytes and time in the second): merge names the file and both parts, and writes nothing. Parts
    of exact copies (times kept) merge; items given as bytes (keys by position) are not compared."""
    import json

    from packer.description.manifest import read_manifest, write_manifest
    from packer.operations.merge import merge
    from packer.pipeline.items import convert_items

    first = _src(tmp_path, "one", n=2)
    same = shutil.copytree(first, tmp_path / "same")
    stale = shutil.copytree(first, tmp_path / "stale")
    make_folder(stale, {"b": [("b1.png", 28, 20)]}, seed=7)

    def part(root, name, rels):
        items = [(os.path.join(root, rel), rel.split("/")[0], None) for rel in rels]
        items.append((open(os.path.join(root, rels[0]), "rb").read() + bytes(len(name)), "a", None))
        return convert_items(items, str(tmp_path / name), "tar", classes=["a", "b"], root=root).output

    p1 = part(first, "p1", ["a/a0.jpg", "b/b1.png"])
    p2 = part(same, "p2", ["a/a1.jpg", "b/b1.png"])
    p3 = part(stale, "p3", ["b/b0.png", "b/b1.png"])
    recorded = read_manifest(p1).source["converted"]
    st = os.stat(os.path.join(first, "b", "b1.png"))
    assert recorded == [["a/a0.jpg", *recorded[0][1:]], ["b/b1.png", st.st_size, st.st_mtime_ns]]  # not the bytes
    assert merge([p1, p2], tmp_path / "ok").manifest.num_samples == 6
    assert "converted" not in json.dumps(read_manifest(str(tmp_path / "ok")).source)
    with pytest.raises(SourceError, match=f"parts {p1} and {p3} disagree about the source file b/b1.png: "):
        merge([p1, p3], tmp_path / "bad")
    assert main(["merge", str(tmp_path / "bad"), p2, p3]) == 1
    err = capsys.readouterr().err
    assert f"parts {p2} and {p3} disagree about the source file b/b1.png" in err and len(err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "bad")
    m = read_manifest(p3)
    m.source["converted"][1][2] = str(st.st_mtime_ns)  # forged: a string where the time goes
    write_manifest(p3, m)
    with pytest.raises(SourceError, match=f"part {p3}: its manifest's source.converted.1. is not .key, size, "):
        merge([p1, p3], tmp_path / "bad")


# -- list rows and lists that are not regular files, endless, or nested without bound ---------------
def test_list_rows_that_are_fifos_devices_or_huge_are_skipped_unread(tmp_path):
    """A FIFO row blocked for ever, /dev/zero was read whole into a MemoryError: each is skipped with
    the reason, checked on the opened descriptor; a file larger than any image within --max-pixels
    is skipped unread."""
    root = _src(tmp_path, "root")
    os.mkfifo(os.path.join(root, "pipe.jpg"))
    os.symlink("/dev/zero", os.path.join(root, "zero.jpg"))
    with open(os.path.join(root, "huge.png"), "wb") as f:
        f.truncate(65 << 20)  # sparse: above 1,000 pixels x 16 bytes + 64 MiB
    lst = os.path.join(root, "l.csv")
    with open(lst, "w") as f:
        f.write("path,label\na/a0.jpg,a\npipe.jpg,a\nzero.jpg,b\nhuge.png,b\nb/b0.png,b\n")
    dst = str(tmp_path / "d")
    r = subprocess.run([sys.executable, "-m", "packer", "convert", "list", "tar", lst, dst, "--workers", "1",
                        "--max-pixels", "1000", "-q"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    from packer.description.manifest import read_manifest

    m = read_manifest(dst)
    reasons = {s.path: s.reason for s in m.skipped}
    assert m.num_samples == 2 and sorted(reasons) == ["huge.png", "pipe.jpg", "zero.jpg"], reasons
    assert reasons["pipe.jpg"] == "not a regular file (a FIFO); not read"
    assert reasons["zero.jpg"] == "not a regular file (a character device); not read"
    assert reasons["huge.png"].startswith(f"{65 << 20} bytes, more than the {1000 * 16 + (64 << 20)} read")


@pytest.mark.parametrize("case", ["fifo", "device", "endless-line", "deep-json", "deep-meta"])
def test_lists_that_are_not_files_endless_or_deeply_nested_are_one_line(tmp_path, case):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, "l.jsonl" if case.startswith("deep") else "l.csv")
    if case == "fifo":
        os.mkfifo(lst)
        why = r"l\.csv: not a regular file \(a FIFO\); not read$"
    elif case == "device":
        os.symlink("/dev/zero", lst)
        why = r"l\.csv: not a regular file \(a character device\); not read$"
    elif case == "endless-line":
        with open(lst, "w") as f:
            f.write("path,label\n" + "x" * (4 << 20))
        why = r"l\.csv:2: line longer than \d+ characters; not a list row$"
    else:
        depth = 100_000 if case == "deep-json" else 100
        with open(lst, "w") as f:
            f.write('{"path": "a/a0.jpg", "label": "a"}\n{"path": "a/a1.jpg", "label": "a", "x": '
                    + "[" * depth + "]" * depth + "}\n")
        why = (r"l\.jsonl:2: JSON nested too deeply to read" if case == "deep-json"
               else r"l\.jsonl:2: metadata\.x(\[0\]){63}: nested more than 64 deep$")
    with pytest.raises(SourceError, match=why):
        read_list(lst)


def test_a_list_with_a_byte_order_mark_is_read(tmp_path):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    for name, text in (("l.csv", "path,label\na/a0.jpg,a\n"), ("l.tsv", "path\tlabel\na/a0.jpg\ta\n"),
                       ("l.jsonl", '{"path": "a/a0.jpg", "label": "a"}\n')):
        lst = os.path.join(root, name)
        with open(lst, "w", encoding="utf-8-sig") as f:  # what Excel's "CSV UTF-8" writes
            f.write(text)
        src = read_list(lst)
        assert src.path_column == "path" and src.items == [(os.path.join(root, "a", "a0.jpg"), "a", None)]


def test_list_rows_naming_one_file_with_conflicting_labels_are_refused(tmp_path):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, "l.csv")
    with open(lst, "w") as f:
        f.write("path,label\na/a0.jpg,a\nb/b0.png,b\n./a/a0.jpg,b\n")
    with pytest.raises(SourceError, match=r"l\.csv:4: './a/a0.jpg' is also on line 2 with label 'a', here 'b'"):
        read_list(lst)
    with open(lst, "w") as f:  # the same label twice is not a conflict
        f.write("path,labels\na/a0.jpg,a|b\nb/b0.png,b\na/a0.jpg,b|a\n")
    assert len(read_list(lst, label_kind="multi").items) == 3


# -- TFRecord labels other tools read, and other tools' TFRecord conventions ------------------------
def _jpgs(tmp_path, n=3):
    root = _src(tmp_path, "jpgs", n)
    return [open(os.path.join(root, "a", f"a{i}.jpg"), "rb").read() for i in range(n)]


def test_an_unlabelled_multi_label_sample_is_an_empty_int64_list(tmp_path):
    """TensorFlow's parse_single_example stopped at an empty *bytes* list under an int64 key; the
    ``tfrecord`` package's typed loader refuses it the same way."""
    from tfrecord.reader import tfrecord_loader

    from packer.datasets import open_dataset
    from packer.layouts.tfexample import example_class
    from packer.layouts.tfrecord import image_record
    from packer.pipeline.engine import ConvertOptions
    from packer.pipeline.items import convert_items

    root = _src(tmp_path, "root")
    items = [(os.path.join(root, "a", "a0.jpg"), [], None), (os.path.join(root, "a", "a1.jpg"), ["a", "b"], None),
             (os.path.join(root, "b", "b0.png"), [], None)]
    dst = str(tmp_path / "d")
    convert_items(items, dst, "tfrecord", ConvertOptions(workers=1, shuffle=False), root=root, label_kind="multi")
    rows = list(tfrecord_loader(os.path.join(dst, "shard-000000.tfrecord"), None, {"image/class/label": "int"}))
    assert [r["image/class/label"].tolist() for r in rows] == [[], [0, 1], []]
    assert open_dataset(dst).targets == [[], [0, 1], []]
    old = example_class()()  # what earlier versions wrote: an empty bytes list, still read as no class
    old.features.feature["image/encoded"].bytes_list.value.append(b"x")
    old.features.feature["image/class/label"].bytes_list.SetInParent()
    assert image_record(example_class(), memoryview(old.SerializeToString()), "f", 0, 0).label == -1


def _foreign(tmp_path, records):
    from tfrecord.writer import TFRecordWriter

    where = tmp_path / "foreign"
    where.mkdir()
    w = TFRecordWriter(str(where / "part-00000.tfrecord"))
    for r in records:
        w.write(r)
    w.close()
    return str(where)


@pytest.mark.parametrize("label, why", [
    (([1, 2], "int"), r"image/class/label holds 2 values \(1, 2\); packer reads one class per record"),
    ((b"cat", "byte"), r"image/class/label holds bytes \(b'cat'\), not int64 class numbers"),
    (([0.5], "float"), r"image/class/label holds floats \(0.5\), not int64 class numbers"),
    (([], "int"), r"image/class/label holds no value"),
])
def test_foreign_tfrecord_labels_that_are_not_one_class_number_are_refused_naming_the_record(tmp_path, label,
                                                                                              why):
    """A multi-valued label was read as its first value, a bytes label said '-1 is negative'."""
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    jpgs = _jpgs(tmp_path)
    where = _foreign(tmp_path, [{"image/encoded": (jpgs[0], "byte"), "image/class/label": (0, "int")},
                                {"image/encoded": (jpgs[1], "byte"), "image/class/label": label}])
    with pytest.raises(CorruptDataError, match=why) as e:
        open_dataset(where, format="tfrecord")
    assert e.value.path.endswith("part-00000.tfrecord") and e.value.sample == 1
    assert main(["info", where]) == 1


def test_foreign_tfrecords_in_tensorflows_image_raw_and_label_convention_are_read(tmp_path):
    import cv2
    import numpy as np

    from packer.datasets import open_dataset

    jpgs = _jpgs(tmp_path)
    where = _foreign(tmp_path, [{"image_raw": (data, "byte"), "label": (i % 2, "int"), "height": (24, "int"),
                                 "width": (24, "int"), "depth": (3, "int")} for i, data in enumerate(jpgs)])
    ds = open_dataset(where, format="tfrecord", output="numpy", fields=("image", "label", "meta"))
    assert [ds[i][1] for i in range(3)] == [0, 1, 0] and ds.classes == ["0", "1"]
    want = cv2.cvtColor(cv2.imdecode(np.frombuffer(jpgs[2], np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(ds[2][0], want)
    assert ds[2][2] == {"depth": 3} and ds.read_record(2).height == 24
    assert main(["convert", "tfrecord", "lmdb", where, str(tmp_path / "l"), "-q"]) == 0


# -- manifests whose file list or class list cannot describe the data ------------------------------
def _forge(d, case):
    payload = [f for f in d["files"] if f["samples"]]
    if case == "first":
        payload[0]["first"] = 2
    elif case == "classes":
        d["classes"] = []
    else:
        d["files"], d["num_samples"] = [], 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_manifests_with_a_wrong_first_no_classes_or_no_files_are_one_line(tmp_path, fmt, capsys):
    """files[].first off was struct.error (TFRecord) naming no file; classes: [] and files: [] were
    accepted, files: [] read as empty and verify died with StopIteration."""
    import json

    from packer.datasets import open_dataset
    from packer.errors import ManifestError

    src = _src(tmp_path)
    for case, why in (("first", r"files\[0\] \('\S+'\) says its first sample is 2, but the files listed before it "
                                r"hold 0"),
                      ("classes", r"classes is empty, but the 6 samples have class labels"),
                      ("files", r"files\[\] lists no file holding samples")):
        dst = str(tmp_path / f"{fmt}-{case}")
        pack(src, dst, fmt)
        path = os.path.join(dst, "manifest.json")
        d = json.load(open(path))
        _forge(d, case)
        json.dump(d, open(path, "w"))
        with pytest.raises(ManifestError, match=why):
            open_dataset(dst)
        capsys.readouterr()
        for cmd in ("verify", "info"):
            assert main([cmd, dst]) == 1, (case, cmd)
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and path in err[0], (case, cmd, err)


# -- the node cache's own failures name the file and the URL --------------------------------------
def test_node_cache_disk_full_read_only_and_symlinks_are_one_line_naming_file_and_url(tmp_path, small_fs):  # noqa: F811
    """Were raw OSErrors naming neither the cache file nor the URL (and the ENOSPC download file
    stayed open, keeping the file system busy)."""
    import errno
    import hashlib

    from packer.storage.nodecache import NodeCache, NodeCacheError

    data = os.urandom(3 << 20)
    src = str(tmp_path / "shard.bin")
    with open(src, "wb") as f:
        f.write(data)
    sha, url = hashlib.sha256(data).hexdigest(), "s3://bucket/ds/shard-000000.tar"
    cache = NodeCache(small_fs)
    view = cache.view("s3://bucket/ds", b"{}")
    with pytest.raises(NodeCacheError, match=r"^node cache: disk full \(no space left on device\): "
                       rf"{view}/shard-000000\.tar while caching {url}; free space there or lower cache_limit$") as e:
        cache.fetch(os.path.join(view, "shard-000000.tar"), len(data), sha, lambda: open(src, "rb"), url)
    assert e.value.errno == errno.ENOSPC and not [n for n in os.listdir(view) if n.endswith(".partial")]
    subprocess.run(["mount", "-o", "remount,ro", small_fs], check=True)
    with pytest.raises(NodeCacheError, match=r"^node cache: read-only file system: .* while caching s3://bucket/b; "
                                             r"set cache_dir \(or PACKER_CACHE_DIR\) to a writable folder$"):
        NodeCache(small_fs).view("s3://bucket/b", b"{}")
    cache = NodeCache(str(tmp_path / "cache"))
    view = cache.view("s3://bucket/ds", b"{}")
    planted = os.path.join(view, "shard-000000.tar")
    os.symlink(src, planted)  # planted where a cached file belongs: removed, never followed
    before = os.stat(src)
    fd = cache.fetch(planted, len(data), sha, lambda: open(src, "rb"), url)
    os.close(fd)
    assert not os.path.islink(planted) and open(planted, "rb").read() == data
    assert (os.stat(src).st_mtime_ns, os.stat(src).st_size) == (before.st_mtime_ns, before.st_size)


# -- crop windows of NumPy integers ------------------------------------------------------------------
class _NumpyWindow:
    """A custom crop whose window is NumPy uint8 scalars (a sum of two wraps at 256)."""

    def window(self, height: int, width: int):
        import numpy as np

        return tuple(np.uint8(v) for v in (200, 3, 100, 50))


def test_numpy_integer_windows_are_ints_and_other_types_are_refused():
    import cv2
    import numpy as np

    from packer.datasets.crops import as_crop
    from packer.images.imageproc import crop_window, decode_payload, decode_payload_window
    from tests.helpers import draw

    rgb = draw(np.random.default_rng(3), 320, 90)
    want = rgb[200:300, 3:53]
    np.testing.assert_array_equal(crop_window(rgb, _NumpyWindow().window), want)  # was an empty 0 x 50 image
    payload = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()
    np.testing.assert_array_equal(decode_payload_window(payload, "jpeg", 320, 90, _NumpyWindow().window),
                                  decode_payload(payload, "jpeg")[200:300, 3:53])
    for bad in ((0.0, 0, 5, 5), (0, 0, True, 5), (0, 0, 5), None):
        with pytest.raises(TypeError, match=r"sample 2 of /d: a crop window must be four integers"):
            crop_window(rgb, lambda h, w, bad=bad: bad, path="/d", sample=2)
    assert as_crop(np.uint8(20)).window(64, 64) == (22, 22, 20, 20)
