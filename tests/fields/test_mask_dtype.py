"""One mask dtype a dataset: masks of 8- and 16-bit PNGs mixed are declared ``uint16`` by the
manifest (version 4), read as it by every reader, batched without error, shown by ``info``; resume,
merge and transcode combine to the widest."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from packer.converters.base import WriterOptions
from packer.datasets import collate, open_dataset
from packer.description.manifest import read_manifest
from packer.description.registry import format_names
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items
from tests.conversion.test_resume import interrupt_after
from tests.helpers import run_bounded


def _masks(wide: set[int], n: int = 5) -> list[np.ndarray]:
    """``n`` 6 x 8 masks, 16-bit (values over 255) at the positions ``wide``, else 8-bit."""
    return [(np.arange(48).reshape(6, 8) * 1000 + i).astype(np.uint16) if i in wide
            else (np.arange(48).reshape(6, 8) % 7 + i).astype(np.uint8) for i in range(n)]


def _items(masks: list[np.ndarray]) -> list[tuple]:
    rng = np.random.default_rng(0)
    return [(cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), np.uint8))[1].tobytes(), "a", None,
             {"mask": cv2.imencode(".png", m)[1].tobytes(), "boxes": [[0, 0, 2, 2]]}) for m in masks]


def _options(**kw) -> ConvertOptions:
    return ConvertOptions(processing=ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png")),
                          **kw)


def _convert(masks, dst, fmt, **kw):
    return convert_items(_items(masks), dst, fmt, _options(**kw), ["a"], keys=[f"k{i}" for i in range(len(masks))])


@pytest.mark.parametrize("fmt", format_names())
def test_mixed_mask_depths_are_declared_uint16_and_every_mask_reads_as_it(tmp_path, fmt, capsys):
    from packer.cli import main

    masks = _masks({3})
    _convert(masks, tmp_path / "d", fmt)
    m = read_manifest(tmp_path / "d")
    assert m.version == 4 and m.fields[0] == {"name": "mask", "kind": "mask", "dtype": "uint16"}
    ds = open_dataset(tmp_path / "d", fields=("image", "mask", "boxes"))
    for i, want in enumerate(masks):
        mask = ds[i][1]
        assert mask.dtype == torch.uint16
        np.testing.assert_array_equal(mask.numpy(), want.astype(np.uint16))  # values unchanged
    for workers in (0, 2):
        batches = list(torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate))
        assert batches[0][1].dtype == torch.uint16 and batches[0][1].shape == (5, 6, 8)
    assert open_dataset(tmp_path / "d", fields=("mask",), output="numpy")[0][0].dtype == np.uint16
    assert main(["info", str(tmp_path / "d")]) == 0
    assert "fields      mask (mask, uint16), boxes (boxes)" in capsys.readouterr().out
    # 8-bit masks only: uint8, as before
    _convert(_masks(set()), tmp_path / "e", fmt)
    assert read_manifest(tmp_path / "e").mask_dtype == "uint8"
    assert open_dataset(tmp_path / "e", fields=("mask",))[4][0].dtype == torch.uint8


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_a_resumed_conversion_keeps_a_16_bit_mask_written_before_the_interruption(tmp_path, monkeypatch, fmt):
    """The only 16-bit mask is sample 0, in the checkpoint; the resumed run adds 8-bit ones only."""
    masks = _masks({0}, n=8)
    writer = WriterOptions(shard_samples=2) if fmt == "tar" else WriterOptions(checkpoint_samples=2)
    interrupt_after(monkeypatch, fmt, 5)
    with pytest.raises(KeyboardInterrupt):
        _convert(masks, tmp_path / "d", fmt, writer=writer)
    monkeypatch.undo()
    report = _convert(masks, tmp_path / "d", fmt, writer=writer, resume=True)
    assert report.resumed is not None and report.resumed["written"] >= 2
    assert report.manifest.mask_dtype == read_manifest(tmp_path / "d").mask_dtype == "uint16"
    np.testing.assert_array_equal(open_dataset(tmp_path / "d", fields=("mask",), output="numpy")[0][0], masks[0])


@pytest.mark.parametrize("fmt", format_names())
def test_merge_declares_the_widest_of_its_parts(tmp_path, fmt):
    from packer.operations.merge import merge

    _convert(_masks(set()), tmp_path / "p8", fmt)
    _convert(_masks({1}), tmp_path / "p16", fmt)
    merged = merge([tmp_path / "p8", tmp_path / "p16"], tmp_path / "m").manifest
    assert merged.mask_dtype == read_manifest(tmp_path / "m").mask_dtype == "uint16"
    ds = open_dataset(tmp_path / "m", fields=("mask",), output="numpy")
    assert len(ds) == 10 and {ds[i][0].dtype for i in range(10)} == {np.dtype(np.uint16)}
    batch = collate([open_dataset(tmp_path / "m", fields=("mask",))[i] for i in range(10)])
    assert batch[0].dtype == torch.uint16


def test_merge_refuses_a_version_3_part_with_a_version_4_one_naming_it(tmp_path):
    import shutil
    import tarfile

    from packer.errors import SourceError
    from packer.operations.merge import merge
    from tests.formats.test_format_versions import DATA

    with tarfile.open(f"{DATA}/v3-fields-datasets.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    shutil.copytree(tmp_path / "v3-fields" / "lmdb", tmp_path / "old")
    _convert(_masks(set()), tmp_path / "new", "lmdb")
    with pytest.raises(SourceError, match=r"old is on-disk version 3 .* convert .*old with this packer first"):
        merge([tmp_path / "new", tmp_path / "old"], tmp_path / "m")


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_a_version_3_dataset_of_mixed_masks_transcodes_to_one_declared_uint16(tmp_path, fmt):
    import tarfile

    from packer.operations.transcode import convert_dataset
    from tests.formats.test_format_versions import DATA

    with tarfile.open(f"{DATA}/v3-fields-datasets.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    report = convert_dataset(str(tmp_path / "v3-fields" / fmt), str(tmp_path / "new"), fmt, fmt)
    assert report.manifest.version == 4 and report.manifest.mask_dtype == "uint16"
    ds = open_dataset(tmp_path / "new", fields=("mask",), output="numpy")
    assert {ds[i][0].dtype for i in range(3)} == {np.dtype(np.uint16)}


def test_a_mask_stored_wider_than_the_declared_dtype_is_corrupt_data_naming_the_sample(tmp_path):
    import json

    from packer.errors import CorruptDataError

    _convert(_masks({2}), tmp_path / "d", "lmdb")
    path = tmp_path / "d" / "manifest.json"
    d = json.loads(path.read_text())
    d["fields"][0]["dtype"] = "uint8"
    path.write_text(json.dumps(d))
    ds = open_dataset(tmp_path / "d", fields=("mask",))
    assert ds[1][0].dtype == torch.uint8
    with pytest.raises(CorruptDataError, match="stored as uint16, wider than the manifest's uint8") as e:
        ds[2]
    assert e.value.sample == 2


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_verify_reports_a_mask_stored_wider_than_the_declared_dtype(tmp_path, fmt):
    import json

    from packer.operations.verify import verify_dataset

    _convert(_masks({2}), tmp_path / "d", fmt)
    assert verify_dataset(tmp_path / "d").ok
    path = tmp_path / "d" / "manifest.json"
    d = json.loads(path.read_text())
    d["fields"][0]["dtype"] = "uint8"
    path.write_text(json.dumps(d))
    rep = verify_dataset(tmp_path / "d")
    assert rep.bad_samples == [2]
    assert len(rep.problems) == 1 and "16 bits per value, wider than the manifest's uint8" in rep.problems[0]


# -- a mask's size comes from its header, before anything is decoded --------------------------------

def _png_of_size(width: int, height: int, bits: int, rows: int | None = None) -> bytes:
    """A grayscale PNG of ``width`` x ``height`` zeros at ``bits`` per pixel, made without an array of
    its pixels; ``rows``: only the first rows' data (a decoder still sizes its buffer by the header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row = zlib.compressobj(9), b"\x00" + bytes(width * bits // 8)
    idat = b"".join(z.compress(row) for _ in range(height if rows is None else rows)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bits, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_huge_mask_is_refused_by_its_header_before_decoding_in_bounded_memory(tmp_path):
    """A 32000 x 32000 16-bit mask (2 GB decoded, a few kB here) is refused by the pixel limit, and a
    12000 x 12000 one (288 MB) of another size than its 456 x 532 image by its size, in a process
    allowed 150 MB more than its imports: neither is decoded."""
    (tmp_path / "bomb.png").write_bytes(_png_of_size(32000, 32000, 16, rows=64))
    (tmp_path / "other.png").write_bytes(_png_of_size(12000, 12000, 16))
    out = run_bounded(f"""
import cv2, numpy as np
from packer.images.fields import FieldSources, process_sample
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.errors import ImageError
image = cv2.imencode(".png", np.zeros((532, 456, 3), np.uint8))[1].tobytes()
opts = ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png"))
for name in ("bomb.png", "other.png"):
    try:
        process_sample(image, opts, FieldSources(mask=open({str(tmp_path)!r} + "/" + name, "rb").read()))
    except ImageError as e:
        print(name, e)
""", 150, tmp_path)
    assert "bomb.png mask: 32000x32000 = 1024000000 pixels is above the limit of 178956970" in out
    assert "other.png mask is 12000x12000 but the image is 456x532" in out
