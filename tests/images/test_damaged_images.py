"""Images that decode wrong or too large: JPEGs libjpeg only warns about, empty payloads, and an
upscale bounded by the pixel limit before decoding."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from packer.cli import main
from tests.helpers import ROOT, make_folder, pack


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
