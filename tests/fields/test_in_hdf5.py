"""HDF5 version 3: masks and extra images in /fields/NAME, boxes in /boxes, read back exactly,
read by plain h5py as docs/FORMATS.md shows, damage named, the layout pinned, resume."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace

import crc32c
import cv2
import h5py
import numpy as np
import pytest

from packer.datasets import open_dataset
from packer.errors import CorruptDataError
from tests.helpers import ROOT, place_seed_by_spec, tree, write_fields_dataset


def _mask(payload) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("fields-hdf5")
    src = write_fields_dataset(root / "fields.hdf5", "hdf5")
    return root, {s[0]: s for s in src}


def test_fields_read_back_exactly(written):
    root, src = written
    ds = open_dataset(str(root / "fields.hdf5"), output="numpy")
    table = ds.sample_table()
    for i in range(len(ds)):
        rec = ds.read_record(i)
        _, _, _, _, mask, left, boxes, _ = src[rec.key]
        assert [(f.name, f.codec, f.channels, f.depth, f.height, f.width) for f in rec.fields] == [
            ("mask", "png", 1, 8, rec.height, rec.width), ("left", "png", 3, 8, rec.height, rec.width)]
        want = cv2.resize(mask, (rec.width, rec.height), interpolation=cv2.INTER_NEAREST)
        got = _mask(rec.fields[0].payload)
        assert got.dtype == np.uint8 and np.array_equal(got, want)
        left_back = ds._decode_payload(rec.fields[1].payload, "png", rec.height, rec.width, i)
        assert np.array_equal(left_back, cv2.resize(left, (rec.width, rec.height), interpolation=cv2.INTER_AREA))
        assert len(table.boxes_of(i)[0]) == len(boxes)


def test_plain_h5py_reads_fields_as_the_docs_show(written, monkeypatch):
    root, src = written
    with open(os.path.join(ROOT, "docs", "FORMATS.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (snippet,) = [b for b in blocks if "fields/mask" in b]
    monkeypatch.chdir(root)
    scope: dict = {}
    exec(compile(snippet, "FORMATS.md", "exec"), scope)  # noqa: S102 - the documentation's own example
    ds = open_dataset(str(root / "fields.hdf5"), output="numpy")
    rec = ds.read_record(0)
    want = cv2.resize(src[rec.key][4], (rec.width, rec.height), interpolation=cv2.INTER_NEAREST)
    assert np.array_equal(scope["mask"], want)
    boxes, labels = ds.sample_table().boxes_of(0)
    assert np.array_equal(scope["boxes"], boxes) and scope["box_labels"].tolist() == labels.tolist()


def test_damaged_field_byte_names_file_sample_field_and_offset(written, tmp_path):
    import shutil

    root, _ = written
    dst = tmp_path / "damaged.hdf5"
    shutil.copytree(root / "fields.hdf5", dst)
    path = str(dst / "data.h5")
    with h5py.File(path, "r") as f:
        start = int(f["fields/left/offsets"][4])
        addr = f["fields/left/images"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(addr + start + 30)
        b = fh.read(1)
        fh.seek(addr + start + 30)
        fh.write(bytes([b[0] ^ 0x10]))
    ds = open_dataset(str(dst), output="numpy")
    for i in (3, 5):
        ds.read_record(i)  # the other samples read
    with pytest.raises(CorruptDataError, match="field 'left' checksum mismatch") as e:
        ds.read_record(4)
    assert (e.value.path, e.value.sample, e.value.offset) == (path, 4, addr + start)
    ds[4]  # the image alone is intact: ds[i] reads no field


def _le_crc(a: np.ndarray) -> int:
    return crc32c.crc32c(a.astype(a.dtype.newbyteorder("<")).tobytes())


def test_layout_pinned(tmp_path):
    src = write_fields_dataset(tmp_path / "a", "hdf5", n=3)
    write_fields_dataset(tmp_path / "b", "hdf5", n=3)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")  # identical input, identical bytes
    ds = open_dataset(str(tmp_path / "a"), output="numpy")
    order = [ds.read_record(i).key for i in range(3)]
    by_key = {s[0]: s for s in src}
    with h5py.File(tmp_path / "a" / "data.h5", "r") as f:
        assert f.attrs["packer_layout"] == 3 and f.attrs["storage"] == "flat"
        assert sorted(f["fields"]) == ["left", "mask"]
        assert {k: f["fields/mask"].attrs[k] for k in ("kind", "codec", "channels", "depth")} == {
            "kind": "mask", "codec": "png", "channels": 1, "depth": 8}
        assert {k: f["fields/left"].attrs[k] for k in ("kind", "codec", "channels", "depth")} == {
            "kind": "image", "codec": "png", "channels": 3, "depth": 8}
        o, images = f["offsets"][()], f["images"][()].tobytes()
        fid, _ = place_seed_by_spec(0, order[0], images[o[0]:o[1]], 0)
        assert f.attrs["file_id"] == fid
        for name in ("mask", "left"):
            g = f[f"fields/{name}"]
            assert sorted(g) == ["crc32c", "images", "offsets", "shapes"]
            kinds = {k: (g[k].dtype.str, g[k].shape, g[k].chunks) for k in g}
            ends = g["offsets"][()]
            assert kinds == {"images": ("|u1", (int(ends[-1]),), (1 << 20,)), "offsets": ("<u8", (4,), (8192,)),
                             "shapes": ("<u4", (3, 2), (8192, 2)), "crc32c": ("<u4", (3,), (8192,))}
            assert ends[0] == 0 and g["shapes"][()].tolist() == f["shapes"][()].tolist()
            data = g["images"][()].tobytes()
            seeds = [place_seed_by_spec(0, order[0], images[o[0]:o[1]], i)[1] for i in range(3)]
            assert g["crc32c"][()].tolist() == [crc32c.crc32c(data[ends[i]:ends[i + 1]], seeds[i]) for i in range(3)]
            for k in ("offsets", "shapes", "crc32c"):
                assert g[k].attrs["crc32c"] == _le_crc(g[k][()])
        assert _mask(f["fields/mask/images"][()][f["fields/mask/offsets"][0]:f["fields/mask/offsets"][1]]).shape == \
            tuple(f["shapes"][0])
        counts = [len(by_key[k][6]) for k in order]
        assert f["box_offsets"][()].tolist() == np.cumsum([0, *counts]).tolist()
        assert (f["boxes"].dtype.str, f["boxes"].shape, f["box_labels"].dtype.str) == ("<f4", (sum(counts), 4), "<i4")
        table = ds.sample_table()
        assert f["boxes"][()].tolist() == np.concatenate([table.boxes_of(i)[0] for i in range(3)]).tolist()
        assert f["box_labels"][()].tolist() == sum((by_key[k][7] for k in order), [])
        for k in ("boxes", "box_offsets", "box_labels"):
            assert f[k].attrs["crc32c"] == _le_crc(f[k][()])


def test_without_boxes_or_with_boxes_only(tmp_path):
    write_fields_dataset(tmp_path / "m", "hdf5", n=3, boxes=False, images=())
    write_fields_dataset(tmp_path / "b", "hdf5", n=3, mask=False, images=())
    with h5py.File(tmp_path / "m" / "data.h5", "r") as f:
        assert sorted(f["fields"]) == ["mask"] and "boxes" not in f and f.attrs["packer_layout"] == 3
    with h5py.File(tmp_path / "b" / "data.h5", "r") as f:
        assert list(f["fields"]) == [] and "boxes" in f and f.attrs["packer_layout"] == 3
    assert [f.name for f in open_dataset(str(tmp_path / "m")).read_record(2).fields] == ["mask"]
    assert open_dataset(str(tmp_path / "b")).read_record(2).fields == ()


def test_file_and_manifest_must_agree_on_fields(tmp_path):
    write_fields_dataset(tmp_path / "d", "hdf5", n=3)
    with h5py.File(tmp_path / "d" / "data.h5", "r+") as f:
        f.attrs["packer_layout"] = 2
    from tests.helpers import forge_manifest_sizes

    forge_manifest_sizes(tmp_path / "d")
    with pytest.raises(CorruptDataError, match="disagree on fields"):
        open_dataset(str(tmp_path / "d")).read_record(0)


@pytest.mark.parametrize("at", [3, 5, 8])
def test_resume_with_fields_gives_the_uninterrupted_bytes(tmp_path, monkeypatch, at):
    import packer.pipeline.engine as engine
    from packer.converters.hdf5 import HDF5Writer

    orig = engine.write_packed

    def resumable(resume: bool):
        def write_packed(dst, fmt, items, template, options):
            items = list(items)
            return orig(dst, fmt, lambda start: iter(items[start:]), template, replace(options, resume=resume),
                        fingerprint={"source": "fields", "options": "test"})

        monkeypatch.setattr(engine, "write_packed", write_packed)

    resumable(False)
    write_fields_dataset(tmp_path / "ref", "hdf5", n=10, checkpoint_samples=2)
    orig_add, count = HDF5Writer.add, [0]

    def add(self, *a, **kw):
        count[0] += 1
        if count[0] > at:
            raise KeyboardInterrupt
        return orig_add(self, *a, **kw)

    monkeypatch.setattr(HDF5Writer, "add", add)
    with pytest.raises(KeyboardInterrupt):
        write_fields_dataset(tmp_path / "out", "hdf5", n=10, checkpoint_samples=2)
    monkeypatch.setattr(HDF5Writer, "add", orig_add)
    resumable(True)
    replay, replayed = HDF5Writer._replayed, []
    monkeypatch.setattr(HDF5Writer, "_replayed", lambda self, *a: replayed.append(1) or replay(self, *a))
    write_fields_dataset(tmp_path / "out", "hdf5", n=10, checkpoint_samples=2)
    assert len(replayed) == at - at % 2  # the samples of the last checkpoint, read back from the log
    a, b = tree(tmp_path / "ref"), tree(tmp_path / "out")
    assert {k: hashlib.sha256(v).hexdigest() for k, v in a.items()} == {
        k: hashlib.sha256(v).hexdigest() for k, v in b.items()}


def test_raw_images_with_fields_are_stored_flat(tmp_path):
    """Raw samples of one size would make an (N, H, W, 3) /images; with fields it stays flat, so a
    later sample of another size never has to move /images away from its fields."""
    from packer.operations.verify import verify_dataset

    write_fields_dataset(tmp_path / "r", "hdf5", encode="raw", resize="24x24")
    with h5py.File(tmp_path / "r" / "data.h5", "r") as f:
        assert f.attrs["storage"] == "flat" and f["images"].ndim == 1 and f["fields/left"].attrs["codec"] == "raw"
    ds = open_dataset(str(tmp_path / "r"), output="numpy")
    rec = ds.read_record(0)
    assert ds[0][0].shape == (24, 24, 3) and [(f.codec, len(f.payload)) for f in rec.fields][1] == ("raw", 24 * 24 * 3)
    assert verify_dataset(tmp_path / "r").ok


def _fields_of_all(ds, q) -> None:
    q.put([[(f.name, bytes(f.payload)) for f in ds.read_record(i).fields] for i in range(len(ds))])


@pytest.mark.parametrize("mapped", [False, True])
def test_spawned_worker_reads_fields_from_the_shared_index(written, monkeypatch, mapped):
    """Read into arrays, the fields' columns go to a spawned worker in the shared region; mapped
    in place (a local file, the default), the worker maps the file itself and none is sent."""
    import multiprocessing

    import packer.datasets.formats.hdf5 as reader

    monkeypatch.setattr(reader, "SHARE_INDEX_BYTES", 1)  # every index array into shared memory
    monkeypatch.setattr(reader, "MAP_INDEX", mapped)
    root, _ = written
    ds = open_dataset(str(root / "fields.hdf5"), output="numpy")
    want = [[(f.name, bytes(f.payload)) for f in ds.read_record(i).fields] for i in range(len(ds))]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_fields_of_all, args=(ds, q))
    p.start()
    got = q.get(timeout=120)
    p.join()
    assert got == want and p.exitcode == 0
    shared = {name for name, *_ in ds._shared_meta[1]} if ds._shared_meta else set()
    if mapped:
        assert ds._meta.mapped and not shared & {"f_offsets", "f_shapes", "f_crcs"}
    else:
        assert {"f_offsets", "f_shapes", "f_crcs"} <= shared


def _drop_mask(f):
    del f["fields/mask"]


@pytest.mark.parametrize("damage, why", [
    (_drop_mask, "/fields/mask is not a group with a flat uint8"),
    (lambda f: f["fields/mask"].attrs.__setitem__("depth", 12), "not a known codec of 8 or 16 bits"),
    (lambda f: f["fields/left"].attrs.__setitem__("codec", "gif2"), "not a known codec"),
    (lambda f: f["fields/left"].attrs.__setitem__("channels", 4), "4 channels"),
    (lambda f: f["fields/mask/crc32c"].attrs.__setitem__("crc32c", np.uint32(1)), "/fields/mask/crc32c checksum"),
])
def test_forged_field_groups_are_refused_at_open(tmp_path, damage, why):
    from tests.helpers import forge_manifest_sizes

    write_fields_dataset(tmp_path / "d", "hdf5", n=3)
    with h5py.File(tmp_path / "d" / "data.h5", "r+") as f:
        damage(f)
    forge_manifest_sizes(tmp_path / "d")
    with pytest.raises(CorruptDataError, match=re.escape(why)):
        open_dataset(str(tmp_path / "d")).read_record(0)
