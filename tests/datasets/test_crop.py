"""Crops made by the reader (``crop=``): the window decode gives a whole decode's pixels, the
fallbacks give the same, and every reader, cache mode and batch path returns what the same crop
as a transform returns."""

from __future__ import annotations

import os
import random
import struct

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer.images.imageproc as imageproc
from packer.datasets import collate, open_dataset
from packer.datasets.crops import CenterCrop, RandomCrop, RandomResizedCrop, as_crop
from packer.datasets.encoded import center_crop
from packer.errors import CorruptDataError
from packer.images.imageproc import (
    WINDOW_DECODER_MINIMUM,
    crop_window,
    decode_payload,
    decode_payload_window,
    window_decoder_version,
    window_decoding,
)
from tests.helpers import DATA, draw, make_folder, need_optional, pack

PHOTO = cv2.cvtColor(draw(np.random.default_rng(5), 83, 121), cv2.COLOR_RGB2BGR)


def need_module() -> None:
    """Skip (or fail under PACKER_REQUIRE_OPTIONAL=1) where the window decode is not in use here."""
    built = window_decoder_version()
    need_optional(window_decoding(), "packer.images._jpegwindow is not built here" if built is None else
                  f"packer.images._jpegwindow was built against libjpeg-turbo {built}, older than "
                  f"{'.'.join(map(str, WINDOW_DECODER_MINIMUM))}")


def spy_on_window_decodes(monkeypatch) -> list:
    """The (top, left, width) of every call of the window decode from now on."""
    calls: list = []
    real = imageproc._jpegwindow.decode_window

    def spy(*args):
        calls.append(args[2:])
        return real(*args)

    monkeypatch.setattr(imageproc._jpegwindow, "decode_window", spy)
    return calls


def jpeg(img: np.ndarray, params=()) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90, *params])
    assert ok
    return buf.tobytes()


def fixed(top: int, left: int, h: int, w: int):
    return lambda height, width: (top, left, h, w)


KINDS = {
    "420": [],
    "422": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
    "444": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
    "progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
    "restart": [cv2.IMWRITE_JPEG_RST_INTERVAL, 2],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_window_decode_is_the_whole_decode_cut(kind, monkeypatch):
    need_module()
    data = jpeg(PHOTO, KINDS[kind])
    whole = decode_payload(data, "jpeg")
    calls = spy_on_window_decodes(monkeypatch)
    rng = random.Random(kind)
    windows = [(0, 0, 83, 121), (0, 0, 1, 1), (82, 120, 1, 1), (16, 32, 40, 50), (1, 3, 81, 117)]
    windows += [(rng.randint(0, 82), rng.randint(0, 120), 0, 0) for _ in range(40)]
    for top, left, h, w in windows:
        h = h or rng.randint(1, 83 - top)
        w = w or rng.randint(1, 121 - left)
        got = decode_payload_window(data, "jpeg", 83, 121, fixed(top, left, h, w))
        assert got.shape == (h, w, 3) and got.strides[1:] == (3, 1)  # interleaved; rows may be wider
        np.testing.assert_array_equal(got, whole[top:top + h, left:left + w], err_msg=f"{kind} {top, left, h, w}")
    assert len(calls) == len(windows)  # every one decoded alone


def test_window_decode_of_gray_jpeg_is_rgb():
    need_module()
    data = jpeg(cv2.cvtColor(PHOTO, cv2.COLOR_BGR2GRAY))
    got = decode_payload_window(data, "jpeg", 83, 121, fixed(5, 7, 30, 40))
    np.testing.assert_array_equal(got, decode_payload(data, "jpeg")[5:35, 7:47])


def _with_orientation(data: bytes, orientation: int) -> bytes:
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1)
            + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + b"\x00\x00\x00\x00")
    app1 = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:]


def test_payloads_the_window_decode_refuses_are_decoded_whole_and_cut(monkeypatch):
    plain = jpeg(PHOTO)
    # EXIF orientation 6: the image is turned, 121 x 83; the window is of the turned image
    turned = _with_orientation(plain, 6)
    got = decode_payload_window(turned, "jpeg", 121, 83, fixed(10, 20, 50, 30))
    np.testing.assert_array_equal(got, decode_payload(turned, "jpeg")[10:60, 20:50])
    # damaged: libjpeg warns, the window decode refuses, the whole decode returns what OpenCV does
    damaged = plain[: len(plain) * 2 // 3] + b"\xff\xd9"
    got = decode_payload_window(damaged, "jpeg", 83, 121, fixed(60, 0, 20, 121))
    np.testing.assert_array_equal(got, decode_payload(damaged, "jpeg")[60:80])
    # a stored size that is not the payload's: the window is placed in the decoded image
    got = decode_payload_window(plain, "jpeg", 300, 300, CenterCrop(40).window)
    np.testing.assert_array_equal(got, decode_payload(plain, "jpeg")[22:62, 40:80])
    # unknown size (datasets written by other tools): decoded whole
    got = decode_payload_window(plain, "jpeg", 0, 0, CenterCrop(40).window)
    np.testing.assert_array_equal(got, decode_payload(plain, "jpeg")[22:62, 40:80])
    # and without packer's C module, everything is decoded whole, with the same pixels
    monkeypatch.setattr(imageproc, "_jpegwindow", None)
    assert not window_decoding()
    got = decode_payload_window(plain, "jpeg", 83, 121, fixed(16, 32, 40, 50))
    np.testing.assert_array_equal(got, decode_payload(plain, "jpeg")[16:56, 32:82])


def test_garbage_and_bad_windows_raise_with_the_sample():
    with pytest.raises(CorruptDataError, match="sample 7"):
        decode_payload_window(b"\xff\xd8 not a jpeg", "jpeg", 10, 10, fixed(0, 0, 5, 5), path="/d", sample=7)
    with pytest.raises(ValueError, match=r"sample 3 of /d: the 83x121 image is smaller than the 100x100 crop"):
        decode_payload_window(jpeg(PHOTO), "jpeg", 83, 121, CenterCrop(100).window, path="/d", sample=3)
    with pytest.raises(ValueError, match=r"sample 4 of /d: the 10x10 crop window at \(80, 0\) does not fit"):
        decode_payload_window(jpeg(PHOTO), "jpeg", 83, 121, fixed(80, 0, 10, 10), path="/d", sample=4)
    with pytest.raises(ValueError, match="does not fit"):
        crop_window(np.zeros((4, 4, 3), np.uint8), fixed(0, 0, 5, 1))


def test_crop_windows_follow_torchvision():
    assert CenterCrop(224).window(256, 341) == (16, 58, 224, 224)
    assert CenterCrop((3, 4)).window(6, 9) == (2, 2, 3, 4)  # round((6-3)/2) = 2, round(2.5) = 2
    assert as_crop(5).size == (5, 5) and as_crop((2, 3)).size == (2, 3) and as_crop(None) is None
    random.seed(1)
    first = [RandomCrop(10).window(40, 50) for _ in range(20)]
    random.seed(1)
    assert [RandomCrop(10).window(40, 50) for _ in range(20)] == first
    assert all(0 <= t <= 30 and 0 <= lft <= 40 and (h, w) == (10, 10) for t, lft, h, w in first)
    assert len(set(first)) > 10
    rrc = RandomResizedCrop(24)
    for _ in range(200):
        t, lft, h, w = rrc.window(40, 60)
        assert 0 <= t and t + h <= 40 and 0 <= lft and lft + w <= 60
        assert 0.08 * 2400 * 0.9 <= h * w <= 2400
    # no window within scale and ratio in 10 tries: the largest centred one within ratio
    assert RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0)).window(10, 40) == (0, 15, 10, 10)
    for bad in (0, (1, 0), "3", (1, 2, 3), True):
        with pytest.raises((TypeError, ValueError)):
            CenterCrop(bad)
    with pytest.raises(ValueError):
        RandomResizedCrop(8, scale=(0.5, 0.1))


def test_random_resized_crop_resizes_the_window():
    pixels = draw(np.random.default_rng(2), 60, 80)
    crop = RandomResizedCrop((20, 30))
    assert crop.finish(pixels[:40, :40]).shape == (20, 30, 3)
    np.testing.assert_array_equal(crop.finish(pixels[:40, :60]),
                                  cv2.resize(pixels[:40, :60], (30, 20), interpolation=cv2.INTER_AREA))
    np.testing.assert_array_equal(crop.finish(pixels[:10, :60]),
                                  cv2.resize(pixels[:10, :60], (30, 20), interpolation=cv2.INTER_LINEAR))
    assert crop.finish(pixels[:20, :30]) is not None


# -- the readers --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """One JPEG and one raw dataset per format, of 12 images 40-60 px a side."""
    root = tmp_path_factory.mktemp("crop")
    rng = np.random.default_rng(9)
    spec = {c: [(f"{c}{i}.jpg", int(rng.integers(40, 60)), int(rng.integers(40, 60))) for i in range(6)]
            for c in ("a", "b")}
    make_folder(str(root / "src"), spec)
    out = {}
    for fmt in ("lmdb", "hdf5", "tar", "tfrecord"):
        pack(str(root / "src"), str(root / fmt), fmt)
    pack(str(root / "src"), str(root / "raw"), "lmdb", encode="raw")
    for name in ("lmdb", "hdf5", "tar", "tfrecord", "raw"):
        out[name] = str(root / name)
    return out


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "tar", "tfrecord", "raw"])
@pytest.mark.parametrize("cache", [None, "encoded", "decoded"])
def test_reader_crop_is_the_transform_crop(packed, name, cache):
    ref = open_dataset(packed[name], transform=lambda x: center_crop(x, (32, 36)))
    ds = open_dataset(packed[name], crop=(32, 36), cache=cache)
    assert isinstance(ds.crop, CenterCrop)
    want = [ref[i] for i in range(len(ref))]
    for _ in range(2):  # a cache is filled, then read
        got = ds.__getitems__(list(range(len(ds))))
        single = [ds[i] for i in range(len(ds))]
        for (wi, wl), (gi, gl), (si, sl) in zip(want, got, single):
            assert gi.shape == (3, 32, 36) and wl == gl == sl
            assert torch.equal(gi, wi) and torch.equal(si, wi)
    np_ds = open_dataset(packed[name], crop=(32, 36), output="numpy")
    assert np_ds[0][0].shape == (32, 36, 3)
    pil = open_dataset(packed[name], crop=(32, 36), output="pil")[0][0]
    assert pil.size == (36, 32) and np.array_equal(np.asarray(pil), want[0][0].permute(1, 2, 0).numpy())


def test_reader_crop_goes_before_the_transform_and_takes_no_encoded_output(packed):
    ds = open_dataset(packed["lmdb"], crop=30, transform=lambda x: x.float().mean(0))
    assert ds[0][0].shape == (30, 30) and ds[0][0].dtype == torch.float32
    with pytest.raises(ValueError, match="crop them after the decode"):
        open_dataset(packed["lmdb"], crop=30, output="encoded")


def test_a_crop_larger_than_an_image_names_the_sample(packed):
    ds = open_dataset(packed["lmdb"], crop=59)
    small = next(i for i in range(len(ds)) if min(ds.read_record(i).height, ds.read_record(i).width) < 59)
    with pytest.raises(ValueError, match=f"sample {small} of .*smaller than the 59x59 crop"):
        ds[small]


def test_damaged_samples_under_crop_raise_or_skip_as_without(packed, tmp_path):
    import shutil

    from tests.helpers import records_by_key  # noqa: F401 - the helpers module is importable here

    src = tmp_path / "src"
    make_folder(str(src), {"a": [("x0.jpg", 40, 40), ("x1.jpg", 40, 40), ("x2.jpg", 40, 40)]})
    pack(str(src), str(tmp_path / "ds"), "tar")
    shard = next(p for p in (tmp_path / "ds").iterdir() if p.suffix == ".tar")
    data = bytearray(shard.read_bytes())
    at = data.find(b"\xff\xda")  # the first image's scan: corrupt it, and the record checksum fails
    data[at + 40:at + 60] = b"\x00" * 20
    shard.write_bytes(bytes(data))
    shutil.rmtree(src)
    with pytest.raises(CorruptDataError):
        open_dataset(str(tmp_path / "ds"), crop=20)[0]
    ds = open_dataset(str(tmp_path / "ds"), crop=20, on_error="skip")
    with pytest.warns(Warning):
        items = ds.__getitems__([0, 1, 2])
    assert [x[0].shape for x in items] == [(3, 20, 20)] * 3 and ds.errors == 1


def _epoch_windows(path: str, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    loader = DataLoader(open_dataset(path, crop=RandomCrop(24)), batch_size=4, num_workers=2, shuffle=False,
                        collate_fn=collate)
    return [images.clone() for images, _ in loader]


def test_random_crops_in_workers_are_seeded_and_differ_between_workers(packed):
    first = _epoch_windows(packed["raw"], 0)
    assert all(torch.equal(a, b) for a, b in zip(first, _epoch_windows(packed["raw"], 0)))
    assert not all(torch.equal(a, b) for a, b in zip(first, _epoch_windows(packed["raw"], 1)))
    # each crop is a window of its image
    whole = open_dataset(packed["raw"], output="numpy")
    flat = torch.cat(first)
    for i in range(len(whole)):
        img = torch.from_numpy(whole[i][0]).permute(2, 0, 1)
        crop = flat[i]
        found = any(torch.equal(img[:, t:t + 24, lft:lft + 24], crop)
                    for t in range(img.shape[1] - 23) for lft in range(img.shape[2] - 23))
        assert found, i


def test_streaming_reader_takes_the_crop(packed):
    from packer.datasets import StreamingDataset

    ds = StreamingDataset(packed["tar"], crop=28, shuffle=False)
    shapes = {tuple(image.shape) for image, _ in ds}
    assert shapes == {(3, 28, 28)}


def test_the_window_decoder_says_which_libjpeg_turbo_it_was_built_against(monkeypatch):
    need_module()
    version = window_decoder_version()
    assert tuple(int(x) for x in version.split(".")) >= WINDOW_DECODER_MINIMUM
    # built against an older libjpeg-turbo than the pixels were checked with: whole decodes
    monkeypatch.setattr(imageproc._jpegwindow, "libjpeg_turbo", "2.0.4")
    assert window_decoder_version() == "2.0.4" and not window_decoding()
    monkeypatch.setattr(imageproc, "_jpegwindow", None)
    assert window_decoder_version() is None and not window_decoding()


# -- where the window decode is not proven equal: arithmetic coding -----------------------------

@pytest.mark.parametrize("name", ["arithmetic.jpg", "arithmetic-progressive.jpg"])
def test_arithmetic_coded_jpegs_are_decoded_whole_and_cut(name, monkeypatch):
    """The window decode links the system's libjpeg-turbo, the whole decode another build: on a
    cut arithmetic-coded JPEG (which libjpeg decodes without a warning) they differed by up to 47
    levels. Such frames are never given to the window decode."""
    with open(os.path.join(DATA, name), "rb") as f:
        data = f.read()
    assert (b"\xff\xca" if "progressive" in name else b"\xff\xc9") in data  # SOF10 / SOF9
    calls = spy_on_window_decodes(monkeypatch) if imageproc._jpegwindow is not None else []
    for cut in (len(data), len(data) * 3 // 20, len(data) * 3 // 5, len(data) * 4 // 5):
        payload = data[:cut] if cut == len(data) else data[:cut] + b"\xff\xd9"
        whole = decode_payload(payload, "jpeg")
        assert whole.shape == (83, 121, 3)
        for top, left, h, w in [(0, 0, 83, 121), (16, 32, 40, 50), (1, 3, 81, 117)]:
            got = decode_payload_window(payload, "jpeg", 83, 121, fixed(top, left, h, w))
            np.testing.assert_array_equal(got, whole[top:top + h, left:left + w], err_msg=f"{name} {cut}")
    assert calls == []


# -- the window's place comes from the JPEG, not from sizes stored beside it ---------------------

def test_a_foreign_tfrecord_with_wrong_sizes_gets_the_window_of_its_jpegs(tmp_path, monkeypatch):
    from tfrecord.writer import TFRecordWriter as PackageWriter

    from packer.datasets.formats.tfrecord import TFRecordDataset

    payloads = [jpeg(PHOTO), jpeg(PHOTO[:, ::-1].copy(), KINDS["progressive"])]
    stored = [(60, 100), (83, 121)]  # the first record's image/height and image/width are wrong
    w = PackageWriter(str(tmp_path / "part-00000.tfrecord"))
    for payload, (h, wd) in zip(payloads, stored):
        w.write({"image/encoded": (payload, "byte"), "image/format": (b"jpeg", "byte"),
                 "image/class/label": (0, "int"), "image/height": (h, "int"), "image/width": (wd, "int")})
    w.close()
    calls = spy_on_window_decodes(monkeypatch) if window_decoding() else None
    for crop in (CenterCrop(40), CenterCrop((20, 100))):
        ds = TFRecordDataset.open_foreign(str(tmp_path), crop=crop, output="numpy")
        whole = TFRecordDataset.open_foreign(str(tmp_path), output="numpy")
        for i in range(len(payloads)):
            assert ds.read_record(i).height == stored[i][0]
            np.testing.assert_array_equal(ds[i][0], crop_window(whole[i][0], crop.window), err_msg=f"{crop} {i}")
    if calls is not None:  # and each was a window decode, placed in the JPEG's own 83 x 121
        assert [c[:2] for c in calls] == [(22, 40), (22, 40), (32, 10), (32, 10)]
