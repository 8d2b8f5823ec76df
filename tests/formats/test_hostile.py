"""Hostile and broken inputs: no code runs from data, no path from a tar member is followed, no
length field makes a reader allocate what the file does not hold, image bombs are refused before
decoding, placeholders (git-LFS pointers, HTML pages) are named as such, and a full disk is a
one-line error that leaves nothing behind."""

from __future__ import annotations

import ast
import errno
import hashlib
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tracemalloc
import zlib

import crc32c
import h5py
import numpy as np
import pytest

from packer.cli import main
from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest, write_manifest
from packer.description.registry import format_names
from packer.errors import CorruptDataError, DiskFullError, SourceError
from packer.images.imageproc import ProcessOptions, parse_encoding
from packer.layouts.tar import INDEX_HEADER, pack_index, unpack_index
from packer.layouts.tfrecord import masked_crc32c
from packer.operations.transcode import convert_dataset
from packer.pipeline.engine import ConvertOptions, convert_imagefolder, temp_dir_for
from tests.helpers import ROOT, make_folder

FORMATS = format_names()
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 123456\n"
HTML = b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>Not Found</body></html>\n"


def opts(fmt: str, **kw) -> ConvertOptions:
    w = WriterOptions(shard_samples=4) if fmt in ("tar", "tfrecord") else WriterOptions()
    return ConvertOptions(processing=ProcessOptions(encoding=parse_encoding("png")), writer=w, workers=1, **kw)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    src = str(base / "src")
    make_folder(src, {c: [(f"{i}.png", 20, 24) for i in range(5)] for c in ("a", "b")})
    return src, {fmt: convert_imagefolder(src, str(base / fmt), fmt, opts(fmt)).output for fmt in FORMATS}


def copy(path, tmp_path, name="ds"):
    dst = tmp_path / name
    shutil.copytree(path, dst)
    return str(dst)


def read_all(path, **kw):
    ds = open_dataset(path, output="numpy", **kw)
    return [ds.read_record(i) for i in range(len(ds))]


# -- no code execution from data ---------------------------------------------------------------------
_UNSAFE = {("pickle", "load"), ("pickle", "loads"), ("marshal", "loads"), ("marshal", "load"), ("dill", "load"),
           ("dill", "loads"), ("cloudpickle", "loads"), ("torch", "load"), ("yaml", "load"), ("shelve", "open")}


def test_no_unsafe_deserialisation_in_any_reader():
    """No pickle/marshal/torch.load/yaml.load/eval/exec anywhere in the package, and every np.load
    passes allow_pickle=False (today there is none: .npy headers are parsed without np.load)."""
    found = []
    for folder in ("packer", "converters", "datasets"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not name.endswith(".py"):
                continue
            path = os.path.join(ROOT, folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in ("eval", "exec", "__import__"):
                    found.append(f"{path}:{node.lineno} {fn.id}()")
                if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
                    if (fn.value.id, fn.attr) in _UNSAFE:
                        found.append(f"{path}:{node.lineno} {fn.value.id}.{fn.attr}()")
                    if fn.value.id in ("np", "numpy") and fn.attr == "load":
                        kw = {k.arg: k.value for k in node.keywords}
                        if not (isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is False):
                            found.append(f"{path}:{node.lineno} np.load without allow_pickle=False")
    assert not found, found


def test_npy_member_with_object_dtype_is_refused(tmp_path):
    """A foreign tar whose .npy member declares an object array (what would need pickle)."""
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (2, 2, 3), }"
    header = header.ljust(118) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x80\x04cos\nsystem\n."
    write_tar(tmp_path / "t.tar", [("s0.npy", npy), ("s0.cls", b"0")])
    ds = open_dataset(tmp_path, format="tar", output="numpy")
    with pytest.raises(CorruptDataError, match="expected uint8"):
        ds[0]


@pytest.mark.parametrize("name,dtype", [("labels", h5py.string_dtype()), ("shapes", np.float64),
                                        ("crc32c", h5py.vlen_dtype(np.uint8)), ("images", np.float32)])
def test_hdf5_non_integer_datasets_are_refused(packed, tmp_path, name, dtype):
    path = copy(packed[1]["hdf5"], tmp_path)
    with h5py.File(os.path.join(path, "data.h5"), "r+") as f:
        shape = f[name].shape
        del f[name]
        f.create_dataset(name, shape=shape, dtype=dtype)
    with pytest.raises(CorruptDataError, match=f"/{name} .*(dtype|integer)"):
        read_all(path)


# -- tar member names are never paths -----------------------------------------------------------------
def write_tar(path, members, links=()):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        for name, target, kind in links:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.linkname = target
            tf.addfile(ti)


def png_bytes(seed=0):
    import cv2

    ok, buf = cv2.imencode(".png", np.random.default_rng(seed).integers(0, 255, (8, 8, 3), np.uint8))
    return buf.tobytes()


def test_tar_member_names_are_keys_never_paths(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    outside = tmp_path / "outside"
    write_tar(src / "a.tar", [
        ("../evil.png", png_bytes(1)), ("../evil.cls", b"0"),
        ("/abs/evil2.png", png_bytes(2)), ("/abs/evil2.cls", b"1"),
        ("ok.png", png_bytes(3)), ("ok.cls", b"1"),
        ("..\\..\\win.png", png_bytes(4)), ("..\\..\\win.cls", b"0"),
    ], links=[("link.png", "/etc/passwd", tarfile.SYMTYPE), ("hard.png", "../evil.png", tarfile.LNKTYPE),
              ("dir/../../x.png", str(outside), tarfile.SYMTYPE)])
    ds = open_dataset(src, format="tar", output="numpy")
    keys = [ds.read_record(i).key for i in range(len(ds))]
    assert sorted(keys) == ["../evil", "/abs/evil2", "ok"]  # links are not samples; a name without a key neither
    before = sorted(os.listdir(tmp_path))
    dst = tmp_path / "unpacked"
    report = convert_dataset(str(src), str(dst), "tar", "imagefolder")
    assert sorted(os.listdir(tmp_path)) == sorted([*before, "unpacked"])
    files = [os.path.join(d, f) for d, _, fs in os.walk(dst) for f in fs]
    assert len(files) == 3 and not any(os.path.islink(f) for f in files)
    assert all(os.path.realpath(f).startswith(str(dst) + os.sep) for f in files)
    assert {why for _, _, why in report.renamed} >= {"'..' step", "absolute path"}
    assert not os.path.exists(tmp_path / "abs") and not os.path.exists(outside)
    # A label without its image (its image was a link) makes the shard unreadable, loudly.
    write_tar(src / "a.tar", [("ok.png", png_bytes(3)), ("ok.cls", b"1"), ("link.cls", b"0")],
              links=[("link.png", "/etc/passwd", tarfile.SYMTYPE)])
    with pytest.raises(CorruptDataError, match="'link' .* has no image member"):
        open_dataset(src, format="tar")


# -- length fields cannot make a reader allocate -----------------------------------------------------
def framed(data: bytes, length: int | None = None) -> bytes:
    head = struct.pack("<Q", len(data) if length is None else length)
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def peak_mb(fn):
    tracemalloc.start()
    try:
        fn()
    except CorruptDataError as e:
        err = e
    else:
        err = None
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak / 1e6


def test_crafted_tfrecord_length_is_refused_before_allocating(tmp_path):
    from packer.layouts.tfexample import encode_example

    good = framed(encode_example({"image/encoded": png_bytes(), "image/class/label": 0}))
    (tmp_path / "a.tfrecord").write_bytes(good + framed(b"x" * 10, length=1 << 40))
    err, mb = peak_mb(lambda: open_dataset(tmp_path, format="tfrecord"))
    assert err is not None and "runs past the end of the file" in str(err) and mb < 50
    bad_crc = bytearray(good)
    bad_crc[9] ^= 1
    (tmp_path / "a.tfrecord").write_bytes(bytes(bad_crc))
    with pytest.raises(CorruptDataError, match="length checksum"):
        open_dataset(tmp_path, format="tfrecord")


def test_hostile_index_and_manifest_cannot_make_a_reader_allocate(packed, tmp_path):
    """An index and a manifest forged together (valid checksums) to promise terabytes."""
    huge = 1 << 40
    path = copy(packed[1]["tfrecord"], tmp_path, "tfr")
    m = read_manifest(path)
    idx = m.files[1]
    assert idx.name.endswith(".idx")
    with open(os.path.join(path, idx.name), "w") as f:
        f.write(f"0 {huge}\n" + "".join(f"{huge + 16 * i} 16\n" for i in range(m.files[0].samples - 1)))
    m.files[0].bytes = huge + 16 * (m.files[0].samples - 1)
    m.files[1].bytes = os.path.getsize(os.path.join(path, idx.name))
    write_manifest(path, m)
    err, mb = peak_mb(lambda: open_dataset(path).read_record(0))
    assert err is not None and "the manifest says" in str(err) and mb < 50

    path = copy(packed[1]["tar"], tmp_path, "tar")
    m = read_manifest(path)
    idx_path = os.path.join(path, m.files[1].name)
    with open(idx_path, "rb") as f:
        first, entries, keys = unpack_index(f.read(), idx_path)
    entries = entries.copy()
    entries["size"][0] = huge
    with open(idx_path, "wb") as f:
        f.write(pack_index(first, entries, keys))
    m.files[0].bytes = 2 * huge
    write_manifest(path, m)
    err, mb = peak_mb(lambda: open_dataset(path).read_record(0))
    assert err is not None and "the manifest says" in str(err) and mb < 50
    assert INDEX_HEADER.size == 32

    path = copy(packed[1]["hdf5"], tmp_path, "h5")
    with h5py.File(os.path.join(path, "data.h5"), "r+") as f:
        offsets = f["offsets"][:]
        offsets[1:] += np.uint64(huge)
        f["offsets"][:] = offsets
        f["offsets"].attrs["crc32c"] = np.uint32(crc32c.crc32c(offsets.astype("<u8").tobytes()))
        f["images"].resize((int(offsets[-1]) + 1,))
    err, mb = peak_mb(lambda: open_dataset(path).read_record(0))
    assert err is not None and ("outside the file" in str(err) or "not stored" in str(err)) and mb < 50


# -- decompression bombs ------------------------------------------------------------------------------
def png_header(width: int, height: int) -> bytes:
    """A PNG that only claims its size: signature, IHDR, an empty IDAT, IEND."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_images_above_the_pixel_limit_are_refused_before_decoding(tmp_path, capsys, monkeypatch):
    src = tmp_path / "src"
    make_folder(str(src), {"a": [("ok.png", 20, 20)]})
    (src / "a" / "bomb.png").write_bytes(png_header(100_000, 100_000))
    import cv2

    decoded = []
    real = cv2.imdecode

    def spy(buf, flags):
        decoded.append(len(buf))
        return real(buf, flags)

    monkeypatch.setattr(cv2, "imdecode", spy)
    report = convert_imagefolder(str(src), str(tmp_path / "out"), "lmdb", ConvertOptions(workers=1))
    reasons = {s.path: s.reason for s in report.skipped}
    assert "above the limit" in reasons["a/bomb.png"] and "decompression bomb" in reasons["a/bomb.png"]
    assert len(decoded) == 1  # only ok.png reached the decoder
    monkeypatch.undo()
    rc = main(["convert", "imagefolder", "tar", str(src), str(tmp_path / "out2"), "--workers", "1",
               "--max-pixels", "100"])
    err = capsys.readouterr().err
    assert rc == 1 and "no image" in err and "Traceback" not in err  # 20x20 = 400 > 100: nothing left


# -- placeholders instead of data ----------------------------------------------------------------------
def payload_files(path):
    return [f.name for f in read_manifest(path).files]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text,words", [(LFS, "git-LFS pointer"), (HTML, "HTML")], ids=["lfs", "html"])
@pytest.mark.parametrize("which", ["first", "all"])
def test_placeholder_payload_files_are_named(packed, tmp_path, fmt, text, words, which):
    path = copy(packed[1][fmt], tmp_path)
    names = payload_files(path)
    for name in names if which == "all" else names[:1]:
        with open(os.path.join(path, name), "wb") as f:
            f.write(text)
    with pytest.raises(CorruptDataError) as info:
        read_all(path)
    msg = str(info.value)
    assert words in msg and "\n" not in msg and any(n in msg for n in names)
    rc = main(["verify", path])
    assert rc == 1


@pytest.mark.parametrize("fmt,suffix", [("tar", ".tar"), ("tfrecord", ".tfrecord")])
def test_placeholder_foreign_shards_are_named(tmp_path, fmt, suffix):
    (tmp_path / f"x{suffix}").write_bytes(LFS)
    with pytest.raises(CorruptDataError, match="git-LFS pointer"):
        open_dataset(tmp_path, format=fmt)


def test_converting_from_a_placeholder_source_is_one_line(packed, tmp_path, capsys):
    path = copy(packed[1]["lmdb"], tmp_path)
    with open(os.path.join(path, "data.mdb"), "wb") as f:
        f.write(LFS)
    rc = main(["convert", "lmdb", "tar", path, str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "git-LFS pointer" in err[0]
    with pytest.raises(SourceError):
        convert_dataset(path, str(tmp_path / "out"), "lmdb", "tar")


# -- disk full -----------------------------------------------------------------------------------------
def tree_digest(root) -> str:
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            p = os.path.join(d, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


@pytest.fixture
def big_source(tmp_path):
    src = tmp_path / "src"
    make_folder(str(src), {c: [(f"{i}.png", 256, 256) for i in range(12)] for c in ("a", "b")})
    return str(src)


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MB tmpfs (needs root and a kernel that lets the test mount; skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield str(mnt)
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_disk_full_on_a_small_tmpfs(fmt, big_source, small_fs):
    """A real ENOSPC, in a subprocess (a crash would not take the test runner with it)."""
    before = tree_digest(big_source)
    dst = os.path.join(small_fs, "out")
    r = subprocess.run([sys.executable, "-m", "packer", "convert", "imagefolder", fmt, big_source, dst,
                        "--workers", "1", "--encode", "raw", "--checkpoint-samples" if fmt in ("lmdb", "hdf5")
                        else "--shard-samples", "4"], capture_output=True, text=True)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(err) == 1 and err[0].startswith("packer: error: disk full: no space left on device while writing ")
    assert temp_dir_for(dst) in err[0] and "partial output was removed" in err[0]
    assert os.listdir(small_fs) == []
    assert tree_digest(big_source) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_size_limit_in_a_subprocess(fmt, big_source, tmp_path):
    """RLIMIT_FSIZE (EFBIG) works without privileges: same clean failure."""
    dst = str(tmp_path / "out")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); "
            "from packer.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "convert", "imagefolder", fmt, big_source, dst, "--workers", "1",
                        "--encode", "png"], capture_output=True, text=True)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and err[0].startswith("packer: error: file size limit:"), r.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_injected_enospc_in_process(fmt, big_source, tmp_path, monkeypatch):
    """ENOSPC from a shard write, injected: DiskFullError, nothing left, even with checkpoints."""
    from packer.converters import shards

    real = shards.ShardFile.write
    written = [0]

    def write(self, data):
        written[0] += len(data)
        if written[0] > 400_000:
            raise OSError(errno.ENOSPC, "No space left on device", self.temp)
        return real(self, data)

    monkeypatch.setattr(shards.ShardFile, "write", write)
    dst = str(tmp_path / "out")
    with pytest.raises(DiskFullError, match="disk full: no space left on device while writing .*partial") as info:
        convert_imagefolder(big_source, dst, fmt, opts(fmt))
    assert info.value.path.endswith(".partial") and "partial output kept" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["src"]
