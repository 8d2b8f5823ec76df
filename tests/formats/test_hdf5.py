"""The HDF5 format: its on-disk layout (readable with h5py alone), storage choices, corruption
detection, the pread fast path and its fallbacks, and process safety."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
import struct

import crc32c
import h5py
import numpy as np
import pytest

import packer.converters.hdf5 as hdf5_writer
from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.datasets.formats.hdf5 import HDF5Dataset
from packer.description.manifest import Manifest, read_manifest
from packer.description.record import CODEC_IDS
from packer.errors import CorruptDataError
from packer.images.imageproc import ProcessedImage
from packer.pipeline.engine import ConvertOptions, write_packed
from tests.helpers import draw, forge_manifest_sizes, make_folder, pack, place_seed_by_spec


def convert(src, dst, encode="jpeg:90", resize="none", **kw):
    return pack(src, dst, "hdf5", encode, resize, workers=1, **kw)


def write_items(dst, items, classes=("a", "b")):
    """Write (key, label, ProcessedImage) items straight through the engine's writer path."""
    template = Manifest(format="hdf5", num_samples=0, classes=list(classes), processing={}, files=[])
    return write_packed(str(dst), "hdf5", ((k, lab, img, None) for k, lab, img in items), template,
                        ConvertOptions(writer=WriterOptions()))


def raw(rng, h, w):
    return ProcessedImage("raw", draw(rng, h, w).tobytes(), h, w)


def h5(path):
    return h5py.File(os.path.join(path, "data.h5"), "r")


def test_flat_layout_reads_with_h5py_alone(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", encode="jpeg:90")
    m = read_manifest(tmp_path / "out")
    assert [f.name for f in m.files] == ["data.h5", "samples.table"] and not os.path.exists(tmp_path / "out" / "data.h5.partial")
    assert m.layout["storage"] == "flat" and m.layout["codec"] == "jpeg"
    ds = open_dataset(tmp_path / "out", output="numpy")
    with h5(tmp_path / "out") as f:
        n = len(pixels)
        assert f.attrs["packer_layout"] == 2 and f.attrs["storage"] == "flat" and f.attrs["codec"] == "jpeg"
        fid = f.attrs["file_id"]
        assert fid == m.files[0].id == place_seed_by_spec(0, keys_of(f)[0], first_payload(f), 0)[0]
        seed = lambda i: crc32c.crc32c(b"PKPL" + bytes.fromhex(fid) + struct.pack("<Q", i))  # noqa: E731
        assert f.attrs["num_samples"] == n
        images, offsets = f["images"], f["offsets"]
        assert images.dtype == np.uint8 and images.ndim == 1 and images.chunks == (hdf5_writer.CHUNK_BYTES,)
        assert images.compression is None
        assert offsets.dtype == np.uint64 and offsets.shape == (n + 1,) and offsets[-1] == images.shape[0]
        assert f["labels"].dtype == np.int64 and f["shapes"].dtype == np.uint32 and f["shapes"].shape == (n, 2)
        assert f["crc32c"].dtype == np.uint32 and "codecs" not in f
        assert f["classes"].asstr()[:].tolist() == ["cat", "dog", "ému bird"]
        attr = json.loads(f.attrs["manifest"])
        assert attr["classes"] == m.classes and attr["processing"] == m.processing
        assert attr["layout"] == m.layout and attr["num_samples"] == n and attr["shuffle_seed"] == 0
        for name in ("labels", "offsets", "shapes", "crc32c"):
            assert f[name].attrs["crc32c"] == crc32c.crc32c(f[name][:].astype(f[name].dtype.newbyteorder("<")).tobytes())
        keys = f["keys"].asstr()[:].tolist()
        for i in range(n):
            payload = images[offsets[i]:offsets[i + 1]].tobytes()
            rec = ds.read_record(i)
            assert bytes(rec.payload) == payload and crc32c.crc32c(payload, seed(i)) == f["crc32c"][i]
            assert rec.key == keys[i] and rec.label == f["labels"][i]
            assert (rec.height, rec.width) == tuple(f["shapes"][i])
        assert sorted(keys) == sorted(k.replace(os.sep, "/") for k in pixels)


def keys_of(f):
    return f["keys"].asstr()[:].tolist()


def first_payload(f):
    return f["images"][int(f["offsets"][0]) : int(f["offsets"][1])].tobytes()


def test_raw_of_one_shape_is_an_n_h_w_3_array(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", encode="raw", resize="20x12")
    ds = open_dataset(tmp_path / "out", output="numpy")
    with h5(tmp_path / "out") as f:
        assert f.attrs["storage"] == "array" and "offsets" not in f
        images = f["images"]
        assert images.shape == (len(ds), 12, 20, 3) and images.chunks[1:] == (12, 20, 3)
        fid = f.attrs["file_id"]
        for i in range(len(ds)):
            np.testing.assert_array_equal(images[i], ds[i][0])
            seed = crc32c.crc32c(b"PKPL" + bytes.fromhex(fid) + struct.pack("<Q", i))
            assert crc32c.crc32c(images[i].tobytes(), seed) == f["crc32c"][i]
    assert read_manifest(tmp_path / "out").layout["image_shape"] == [12, 20, 3]


def test_mixed_codecs_have_a_codecs_dataset(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", encode="keep")
    ds = open_dataset(tmp_path / "out")
    with h5(tmp_path / "out") as f:
        assert f.attrs["codec"] == "mixed"
        ids = f["codecs"][:]
        names = {int(k): v for k, v in json.loads(f["codecs"].attrs["names"]).items()}
        keys = f["keys"].asstr()[:].tolist()
    for i, key in enumerate(keys):
        assert names[ids[i]] == ("png" if key.endswith(".png") else "jpeg") == ds.read_record(i).codec
        with open(os.path.join(src, key), "rb") as fh:
            assert fh.read() == bytes(ds.read_record(i).payload)  # keep stores the source bytes


def test_raw_shape_change_switches_to_flat_storage(tmp_path, monkeypatch):
    """Raw samples of one shape start an (N, H, W, 3) array; a later sample of another shape moves
    everything already written to flat storage in a fresh file (no dead space)."""
    monkeypatch.setattr(hdf5_writer, "_BLOCK_SAMPLES", 4)
    rng = np.random.default_rng(0)
    import cv2

    items = [(f"a/{i}", i % 2, raw(rng, 8, 10)) for i in range(11)]
    ok, buf = cv2.imencode(".png", draw(rng, 5, 7))
    items += [("b/odd", 1, raw(rng, 9, 10)), ("b/png", 0, ProcessedImage("png", buf.tobytes(), 5, 7))]
    write_items(tmp_path / "out", items)
    assert sorted(os.listdir(tmp_path / "out")) == ["data.h5", "manifest.json", "samples.table"]
    ds = open_dataset(tmp_path / "out", output="numpy")
    with h5(tmp_path / "out") as f:
        assert f.attrs["storage"] == "flat" and f.attrs["codec"] == "mixed"
    for i, (key, label, img) in enumerate(items):
        rec = ds.read_record(i)
        assert (rec.key, rec.label, bytes(rec.payload), rec.codec) == (key, label, img.payload, img.codec)
    # Same input, same bytes: the switch is a function of the data only.
    write_items(tmp_path / "again", items)
    assert (tmp_path / "out" / "data.h5").read_bytes() == (tmp_path / "again" / "data.h5").read_bytes()


def test_samples_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5_writer, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(hdf5_writer, "_BLOCK_BYTES", 3000)
    rng = np.random.default_rng(1)
    items = [(f"a/{i}", 0, raw(rng, int(rng.integers(5, 40)), int(rng.integers(5, 40)))) for i in range(40)]
    write_items(tmp_path / "out", items)
    ds = open_dataset(tmp_path / "out", output="numpy")
    with h5(tmp_path / "out") as f:
        assert f["images"].chunks == (1000,) and f["images"].id.get_num_chunks() > 20
    for i, (_, _, img) in enumerate(items):
        assert bytes(ds.read_record(i).payload) == img.payload
        np.testing.assert_array_equal(ds[i][0], np.frombuffer(img.payload, np.uint8).reshape(img.height, img.width, 3))


def _rewrite_images(path, **create):
    """Re-create /images of a finished file with other storage (as h5repack would)."""
    with h5py.File(os.path.join(path, "data.h5"), "r+") as f:
        data = f["images"][:]
        del f["images"]
        f.create_dataset("images", data=data, **create)


@pytest.mark.parametrize("storage", [{}, {"chunks": (64,), "compression": "gzip"}], ids=["contiguous", "gzip"])
def test_repacked_images_still_read(tiny_folder, tmp_path, storage):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", encode="png")
    want = [open_dataset(tmp_path / "out", output="numpy")[i][0] for i in range(3)]
    _rewrite_images(tmp_path / "out", **storage)
    forge_manifest_sizes(tmp_path / "out")  # a user who repacks the file records it anew
    ds = open_dataset(tmp_path / "out", output="numpy")
    for i in range(3):
        np.testing.assert_array_equal(ds[i][0], want[i])
    ds._ensure_open()
    assert (ds._meta.base is not None) == (not storage) and (ds._h5 is not None) == bool(storage)


def _payload_file_offset(path, i):
    ds = open_dataset(path)
    ds._ensure_open()
    start = int(ds._meta.offsets[i])
    return int(ds._meta.table[start // ds._meta.chunk]) + start % ds._meta.chunk


def test_a_flipped_payload_byte_names_file_sample_and_offset(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    path = tmp_path / "out" / "data.h5"
    off = _payload_file_offset(tmp_path / "out", 5)
    with open(path, "r+b") as f:
        f.seek(off + 40)
        b = f.read(1)
        f.seek(off + 40)
        f.write(bytes([b[0] ^ 0xFF]))
    ds = open_dataset(tmp_path / "out")
    with pytest.raises(CorruptDataError, match="checksum mismatch") as e:
        ds[5]
    assert e.value.path == str(path) and e.value.sample == 5 and e.value.offset == off
    ds[4], ds[6]  # the others still read
    skip = open_dataset(tmp_path / "out", on_error="skip")
    skip[5]
    assert skip.errors == 1


def test_corrupt_metadata_is_refused_on_open(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    with h5py.File(tmp_path / "out" / "data.h5", "r+") as f:
        f["labels"][0] = f["labels"][0] + 1
    with pytest.raises(CorruptDataError, match="/labels checksum mismatch"):
        open_dataset(tmp_path / "out")[0]
    assert open_dataset(tmp_path / "out", verify=False)[0] is not None


@pytest.mark.parametrize("damage", ["truncate", "missing", "garbage"])
def test_damaged_file(tiny_folder, tmp_path, damage):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    path = tmp_path / "out" / "data.h5"
    if damage == "truncate":
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size // 3)
    elif damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"\0" * 4096)
    with pytest.raises(CorruptDataError) as e:
        ds = open_dataset(tmp_path / "out")
        for i in range(len(ds)):
            ds[i]
    assert str(path) in str(e.value)


def test_no_hdf5_file_stays_open_and_pickles_carry_no_handles(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    ds = open_dataset(tmp_path / "out")
    ds[0]
    ds.read_record(1)
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == 0  # nothing for a fork to inherit
    state = pickle.loads(pickle.dumps(ds)).__dict__
    assert state["_meta"] is None and state["_file"] is None and state["_keys"] is None
    ds.close()


def _read_all_in_child(ds, q):
    try:
        q.put(sorted(ds.read_record(i).label for i in range(len(ds))))
    except BaseException as e:  # noqa: BLE001 - report to the parent
        q.put(repr(e))


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_child_processes_open_their_own_handles(tiny_folder, tmp_path, ctx):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    ds = open_dataset(tmp_path / "out")
    ds[0]
    parent_fd = ds._file.fileno()
    mp = multiprocessing.get_context(ctx)
    q = mp.Queue()
    p = mp.Process(target=_read_all_in_child, args=(ds, q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert got == sorted(ds.read_record(i).label for i in range(len(ds)))
    assert ds._file.fileno() == parent_fd  # the parent's handle is untouched and still works
    ds[1]


def test_same_bytes_for_raw_and_keep(tiny_folder, tmp_path):
    src, _ = tiny_folder
    for encode in ("raw", "keep"):
        convert(src, tmp_path / f"{encode}1", encode=encode)
        convert(src, tmp_path / f"{encode}2", encode=encode)
        m1, m2 = read_manifest(tmp_path / f"{encode}1"), read_manifest(tmp_path / f"{encode}2")
        assert m1.files[0].sha256 == m2.files[0].sha256


def test_reader_class_and_empty_writer(tmp_path):
    """The registry maps hdf5 to HDF5Dataset; a writer closed without samples leaves a valid file."""
    w = hdf5_writer.HDF5Writer(str(tmp_path), WriterOptions())
    files, layout = w.close()
    assert files[0].samples == 0 and layout["storage"] == "flat"
    with h5py.File(tmp_path / "data.h5") as f:
        assert f["offsets"][:].tolist() == [0] and f.attrs["codec"] == "none"


def test_codec_ids_match_the_record_table():
    assert set(CODEC_IDS) >= {"raw", "jpeg", "png", "webp"}
    assert HDF5Dataset.format == "hdf5"


def test_many_samples_write_in_blocks(tmp_path, monkeypatch):
    """More samples than a block and a key block: keys and metadata stay aligned."""
    import packer.datasets.formats.hdf5 as reader

    monkeypatch.setattr(hdf5_writer, "_BLOCK_SAMPLES", 7)
    monkeypatch.setattr(reader, "_KEY_BLOCK", 5)
    root = tmp_path / "src"
    make_folder(str(root), {"a": [(f"{i}.png", 6, 6) for i in range(23)], "b": [(f"{i}.png", 6, 6) for i in range(9)]})
    convert(str(root), tmp_path / "out", encode="png")
    ds = open_dataset(tmp_path / "out", output="numpy")
    keys = [ds.read_record(i).key for i in range(len(ds))]
    assert sorted(keys) == sorted([f"a/{i}.png" for i in range(23)] + [f"b/{i}.png" for i in range(9)])
    assert all(ds.read_record(i).label == (0 if k.startswith("a/") else 1) for i, k in enumerate(keys))
    shutil.rmtree(tmp_path / "out")


def test_keys_come_from_the_sample_table_without_opening_h5py(tiny_folder, tmp_path, monkeypatch):
    """read_record's key is the sample table's (checked against /key_crc32c), not a /keys block
    read through h5py (milliseconds per random read); /keys still decides when they differ."""
    import packer.datasets.formats.hdf5 as reader

    src, _ = tiny_folder
    convert(src, tmp_path / "out", encode="png")
    want = [open_dataset(tmp_path / "out").read_record(i).key for i in range(3)]
    ds = open_dataset(tmp_path / "out")
    ds[0]  # handles open

    def no_h5py(*a, **kw):
        raise AssertionError("h5py opened for a key")

    monkeypatch.setattr(reader, "_h5open", no_h5py)
    assert [ds.read_record(i).key for i in range(3)] == want
    monkeypatch.undo()
    monkeypatch.setattr(type(ds.sample_table()), "keys", property(lambda table: ["other"] * len(ds)))
    assert [ds.read_record(i).key for i in range(3)] == want  # the table disagrees: /keys is read
    monkeypatch.undo()
    audited = open_dataset(tmp_path / "out")
    audited[0]
    audited.audit = True  # packer verify: /keys itself is read and checked
    monkeypatch.setattr(reader, "_h5open", no_h5py)
    with pytest.raises(CorruptDataError, match="cannot read /keys"):
        audited.read_record(1)
