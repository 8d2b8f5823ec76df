"""The image pipeline: modes, orientation, resize policies, encodings, limits, bad bytes."""

from __future__ import annotations

import os
import struct

import cv2
import numpy as np
import pytest

from packer.errors import ImageError
from packer.images.imageheader import sniff
from packer.images.imageproc import (
    REDUCED_DECODE_MARGIN,
    ProcessOptions,
    check_encoded,
    decode_payload,
    jpeg_truncation,
    parse_encoding,
    parse_resize,
    process_image,
    reduction_factor,
    target_size,
)
from tests.helpers import DATA, draw, psnr


def enc(img: np.ndarray, ext: str, params=()) -> bytes:
    ok, buf = cv2.imencode(ext, img, list(params))
    assert ok
    return buf.tobytes()


def opts(resize="none", encode="png", **kw) -> ProcessOptions:
    return ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode), **kw)


def decoded(p) -> np.ndarray:
    return decode_payload(p.payload, p.codec, p.height, p.width)


RGB = draw(np.random.default_rng(0), 30, 40)
BGR = cv2.cvtColor(RGB, cv2.COLOR_RGB2BGR)


def test_png_rgb_round_trip_is_exact_and_rgb_ordered():
    p = process_image(enc(BGR, ".png"), opts())
    assert (p.codec, p.height, p.width) == ("png", 30, 40)
    np.testing.assert_array_equal(decoded(p), RGB)
    raw = process_image(enc(BGR, ".png"), opts(encode="raw"))
    assert raw.codec == "raw" and raw.payload == RGB.tobytes()


def test_gray_becomes_rgb():
    gray = RGB[..., 0].copy()
    out = decoded(process_image(enc(gray, ".png"), opts()))
    assert out.shape == (30, 40, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], gray)


def test_rgba_drops_alpha_like_pil_convert_rgb():
    bgra = np.dstack([BGR, np.full((30, 40), 7, np.uint8)])
    out = decoded(process_image(enc(bgra, ".png"), opts()))
    np.testing.assert_array_equal(out, RGB)


def test_16bit_becomes_8bit():
    img16 = BGR.astype(np.uint16) * 257
    out = decoded(process_image(enc(img16, ".png"), opts()))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, RGB)


def test_palette_png_becomes_rgb():
    import io

    from PIL import Image

    pal = Image.fromarray(RGB).convert("P", palette=Image.ADAPTIVE, colors=16)
    buf = io.BytesIO()
    pal.save(buf, format="PNG")
    out = decoded(process_image(buf.getvalue(), opts()))
    np.testing.assert_array_equal(out, np.asarray(pal.convert("RGB")))


def test_cmyk_jpeg_becomes_rgb():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(RGB).convert("CMYK").save(buf, format="JPEG", quality=95)
    out = decoded(process_image(buf.getvalue(), opts()))
    assert out.shape == (30, 40, 3)
    assert psnr(out, RGB) > 25


def _with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """Insert an EXIF APP1 segment with the given orientation right after SOI."""
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + b"\x00\x00\x00\x00"
    app1 = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + jpeg[2:]


@pytest.mark.parametrize("orientation,expect", [(1, lambda a: a), (3, lambda a: a[::-1, ::-1]), (6, lambda a: np.rot90(a, -1)), (8, lambda a: np.rot90(a, 1))])
def test_exif_orientation_is_honoured(orientation, expect):
    data = _with_orientation(enc(BGR, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 100]), orientation)
    assert sniff(data).orientation == orientation
    out = decoded(process_image(data, opts()))
    want = expect(RGB)
    assert out.shape == want.shape
    assert psnr(out, np.ascontiguousarray(want)) > 30


@pytest.mark.parametrize("policy,size,expect", [
    ("shorter:20", (40, 30), (26, 20)), ("shorter:20", (30, 40), (20, 26)), ("shorter:50", (40, 30), (40, 30)),
    ("longer:20", (40, 30), (20, 15)), ("longer:50", (40, 30), (40, 30)), ("16x8", (40, 30), (16, 8)),
    ("none", (40, 30), (40, 30)),
])
def test_target_size(policy, size, expect):
    assert target_size(*size, parse_resize(policy)) == expect


def test_upscale_only_when_asked():
    assert target_size(40, 30, parse_resize("shorter:60")) == (40, 30)
    assert target_size(40, 30, parse_resize("shorter:60"), upscale=True) == (80, 60)
    p = process_image(enc(BGR, ".png"), opts("shorter:60", upscale=True))
    assert (p.height, p.width) == (60, 80)


def test_shrink_uses_inter_area():
    p = process_image(enc(BGR, ".png"), opts("shorter:15"))
    want = cv2.cvtColor(cv2.resize(BGR, (20, 15), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(decoded(p), want)


def test_reduced_jpeg_decode_is_close_to_full_decode():
    big = cv2.resize(BGR, (800, 600), interpolation=cv2.INTER_CUBIC)
    data = enc(big, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95])
    fast = decoded(process_image(data, opts("shorter:64", encode="raw")))
    exact = decoded(process_image(data, opts("shorter:64", encode="raw", reduced_decode=False)))
    assert fast.shape == exact.shape == (64, 85, 3)
    assert psnr(fast, exact) > 40


def test_reduced_decode_keeps_twice_the_target():
    """600 px to 64: 1/8 (75 px) would cover the target, but the decode stops at 1/4 (150 px,
    at least 2x), then INTER_AREA as usual; the manifest records the rule."""
    assert REDUCED_DECODE_MARGIN == 2
    big = cv2.resize(BGR, (800, 600), interpolation=cv2.INTER_CUBIC)
    data = enc(big, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95])
    got = decoded(process_image(data, opts("shorter:64", encode="raw")))
    quarter = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_4)
    assert quarter.shape == (150, 200, 3)
    want = cv2.cvtColor(cv2.resize(quarter, (85, 64), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(got, want)
    eighth = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_8)
    assert not np.array_equal(got, cv2.cvtColor(cv2.resize(eighth, (85, 64), interpolation=cv2.INTER_AREA),
                                                 cv2.COLOR_BGR2RGB))
    assert opts("shorter:64").to_json()["reduced_decode_margin"] == 2
    assert "reduced_decode_margin" not in opts("shorter:64", reduced_decode=False).to_json()


@pytest.mark.parametrize("size,target,margin,factor", [
    ((4000, 3000), (341, 256), 2, 4),   # 1/8 = 375 px is under 2 x 256
    ((4000, 3000), (341, 256), 1, 8),
    ((4000, 3000), (213, 160), 2, 8),   # 1/8 = 375 px >= 320
    ((3000, 2000), (384, 256), 2, 2),   # 1/4 = 500 px is under 512
    ((1000, 872), (293, 256), 2, 1),
    ((1000, 872), (293, 256), 1, 2),
    ((500, 4000), (256, 2048), 2, 1),   # both sides count
])
def test_reduction_factor(size, target, margin, factor):
    assert reduction_factor(*size, *target, margin) == factor


@pytest.mark.parametrize("encoding,codec", [("jpeg:80", "jpeg"), ("webp:80", "webp"), ("png", "png"), ("raw", "raw")])
def test_encodings(encoding, codec):
    p = process_image(enc(BGR, ".png"), opts(encode=encoding))
    assert p.codec == codec
    assert psnr(decoded(p), RGB) > 28


def test_keep_stores_original_bytes_only_when_nothing_changes():
    jpg = enc(BGR, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 93])
    assert process_image(jpg, opts(encode="keep")).payload == jpg
    resized = process_image(jpg, opts("shorter:15", encode="keep"))
    assert resized.codec == "jpeg" and resized.payload != jpg and resized.height == 15
    gray_png = enc(RGB[..., 0].copy(), ".png")
    kept = process_image(gray_png, opts(encode="keep"))
    assert kept.codec == "png" and kept.payload != gray_png  # re-encoded as RGB, losslessly
    rotated = _with_orientation(jpg, 6)
    assert process_image(rotated, opts(encode="keep")).payload != rotated


def test_pixel_limit_refuses_before_decoding():
    # A PNG header claiming 100000 x 100000 pixels, with no pixel data at all.
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    with pytest.raises(ImageError, match="above the limit"):
        process_image(header + b"\x00" * 16, opts())
    with pytest.raises(ImageError, match="above the limit"):
        process_image(enc(BGR, ".png"), opts(max_pixels=100))


@pytest.mark.parametrize("data,reason", [
    (b"", "empty file"),
    (b"hello world", "not a recognised image"),
    (b"<!DOCTYPE html><html>404</html>", "HTML"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n", "git-LFS"),
])
def test_non_images_are_refused_with_a_reason(data, reason):
    with pytest.raises(ImageError, match=reason):
        process_image(data, opts())


def test_truncated_files_are_refused():
    jpg = enc(BGR, ".jpg")
    with pytest.raises(ImageError, match="truncated"):
        process_image(jpg[: len(jpg) // 2], opts())
    png = enc(BGR, ".png")
    with pytest.raises(ImageError):
        process_image(png[: len(png) // 2], opts())


def _scan_starts(data: bytes) -> list[int]:
    starts, at = [], data.find(b"\xff\xda")
    while at >= 0:
        starts.append(at)
        at = data.find(b"\xff\xda", at + 1)
    return starts


@pytest.mark.parametrize("name", ["arithmetic.jpg", "arithmetic-progressive.jpg", "huffman-progressive"])
def test_cut_jpegs_with_an_end_marker_are_skipped_as_truncated(name):
    """A JPEG cut short and given an end marker: libjpeg warns where a Huffman-coded scan ends
    early, but decodes a cut arithmetic-coded scan, and a progressive JPEG cut between two scans,
    without a word (up to 255 levels off). One rule skips them all, in conversion and in copies."""
    import os

    if name == "huffman-progressive":
        data = enc(draw(np.random.default_rng(5), 83, 121), ".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    else:
        with open(os.path.join(DATA, name), "rb") as f:
            data = f.read()
    assert jpeg_truncation(data) is None
    assert process_image(data, opts(encode="raw")).height == 83
    check_encoded(data)
    starts = _scan_starts(data)
    # within scans: not within an arithmetic-coded refinement scan, which cannot be told from a
    # complete one (docs/reliability.md)
    refinement = [(at, end) for at, end in zip(starts, starts[1:] + [len(data)])
                  if "arithmetic" in name and data[at + 7 + 2 * data[at + 4]] >> 4]
    cuts = [cut for cut in (len(data) * k // 20 for k in range(3, 20))
            if not any(at < cut < end for at, end in refinement)]
    cuts += starts[1:]  # between scans
    skipped = 0
    for cut in cuts:
        bad = data[:cut] + b"\xff\xd9"
        try:
            process_image(bad, opts(encode="raw"))
        except ImageError as e:
            skipped += 1
            assert "truncated" in str(e) or "damaged" in str(e) or "could not decode" in str(e), (cut, e)
            continue
        raise AssertionError(f"{name} cut at {cut} of {len(data)} bytes was packed")
    assert skipped == len(cuts)
    for cut in cuts:
        with pytest.raises(ImageError):
            check_encoded(data[:cut] + b"\xff\xd9")
    # --keep-damaged-jpeg keeps what libjpeg decodes
    assert process_image(data[: len(data) * 3 // 5] + b"\xff\xd9", opts(encode="raw", keep_damaged_jpeg=True))


def test_truncation_reasons_say_what_is_missing():
    with open(os.path.join(DATA, "arithmetic-progressive.jpg"), "rb") as f:
        data = f.read()
    scans = _scan_starts(data)
    assert "no end-of-image marker" in jpeg_truncation(data[:-2])
    assert "cut between two scans: after scan 3, some" in jpeg_truncation(data[: scans[3]] + b"\xff\xd9")
    with open(os.path.join(DATA, "arithmetic.jpg"), "rb") as f:
        baseline = f.read()
    assert jpeg_truncation(baseline[: len(baseline) // 2] + b"\xff\xd9") == (
        "truncated JPEG (arithmetic-coded scan 1 of 1 is at least 256 bytes short)")
    with pytest.raises(ImageError, match=r"arithmetic-coded scan .* \(--keep-damaged-jpeg keeps such files\)"):
        process_image(baseline[: len(baseline) * 9 // 10] + b"\xff\xd9", opts())


@pytest.mark.parametrize("bad", ["shorter:0", "shorter", "10x", "wide:5", ""])
def test_bad_resize_policies(bad):
    with pytest.raises(ValueError, match="resize"):
        parse_resize(bad)


@pytest.mark.parametrize("bad", ["jpeg:0", "jpeg:101", "gif", "raw:3"])
def test_bad_encodings(bad):
    with pytest.raises(ValueError, match="encoding"):
        parse_encoding(bad)


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tiff", ".ppm", ".pgm"])
def test_sniff_reads_sizes_of_every_torchvision_extension(ext):
    img = BGR if ext != ".pgm" else BGR[..., 0].copy()
    info = sniff(enc(img, ext))
    assert info is not None and (info.width, info.height) == (40, 30)


# -- the readers' JPEG decode: TurboJPEG where it gives OpenCV's pixels, OpenCV where it decides -----

def _cv2_rgb(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)


_PHOTO = cv2.cvtColor(draw(np.random.default_rng(3), 97, 131), cv2.COLOR_RGB2BGR)


@pytest.mark.parametrize("params", [
    [cv2.IMWRITE_JPEG_QUALITY, 90],
    [cv2.IMWRITE_JPEG_QUALITY, 75, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
    [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
    [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
    [cv2.IMWRITE_JPEG_QUALITY, 95, cv2.IMWRITE_JPEG_OPTIMIZE, 1],
], ids=["420", "444", "422", "progressive", "optimized"])
def test_read_decode_gives_opencvs_pixels(params):
    data = enc(_PHOTO, ".jpg", params)
    out = decode_payload(data, "jpeg")
    assert out.dtype == np.uint8 and out.flags.writeable
    np.testing.assert_array_equal(out, _cv2_rgb(data))
    np.testing.assert_array_equal(decode_payload(memoryview(bytearray(data)), "jpeg"), out)
    np.testing.assert_array_equal(decode_payload(np.frombuffer(data, np.uint8), "jpeg"), out)


def test_read_decode_of_gray_jpeg_is_rgb_like_opencv():
    data = enc(cv2.cvtColor(_PHOTO, cv2.COLOR_BGR2GRAY), ".jpg")
    out = decode_payload(data, "jpeg")
    assert out.shape == (97, 131, 3)
    np.testing.assert_array_equal(out, _cv2_rgb(data))


def test_read_decode_takes_the_fast_decoder_and_leaves_turns_and_damage_to_opencv(monkeypatch):
    import packer.images.imageproc as imageproc

    calls = []
    real = imageproc._simplejpeg.decode_jpeg

    def spy(data, **kw):
        calls.append(kw)
        return real(data, **kw)

    monkeypatch.setattr(imageproc._simplejpeg, "decode_jpeg", spy)
    plain = enc(_PHOTO, ".jpg")
    decode_payload(plain, "jpeg")
    assert calls == [{"colorspace": "rgb", "strict": True}]
    # EXIF that says "as stored": the same pixels either way, so the fast decoder
    upright = _with_orientation(plain, 1)
    np.testing.assert_array_equal(decode_payload(upright, "jpeg"), _cv2_rgb(upright))
    assert len(calls) == 2
    # EXIF orientation 6: OpenCV turns the image, so it decodes (also from an array, as the
    # encoded batches' CPU decode passes it)
    rotated = _with_orientation(plain, 6)
    out = decode_payload(rotated, "jpeg")
    assert len(calls) == 2 and out.shape == (131, 97, 3)
    np.testing.assert_array_equal(out, _cv2_rgb(rotated))
    np.testing.assert_array_equal(decode_payload(np.frombuffer(rotated, np.uint8), "jpeg"), out)
    assert len(calls) == 2
    # EXIF after the JFIF segment OpenCV writes first is found too
    assert plain[2:4] == b"\xff\xe0"
    app0_end = 4 + struct.unpack(">H", plain[4:6])[0]
    later = _with_orientation(plain[:2] + plain[app0_end:], 8)
    later = later[:2] + plain[2:app0_end] + later[2:]
    out = decode_payload(later, "jpeg")
    assert len(calls) == 2 and out.shape == (131, 97, 3)
    np.testing.assert_array_equal(out, _cv2_rgb(later))
    # damaged: libjpeg warns, TurboJPEG refuses in strict mode, OpenCV returns what it decoded
    damaged = plain[: len(plain) * 2 // 3] + b"\xff\xd9"
    out = decode_payload(damaged, "jpeg")
    np.testing.assert_array_equal(out, _cv2_rgb(damaged))


def test_read_decode_without_the_fast_decoder_is_the_same(monkeypatch):
    import packer.images.imageproc as imageproc

    data = enc(_PHOTO, ".jpg")
    fast = decode_payload(data, "jpeg")
    monkeypatch.setattr(imageproc, "_simplejpeg", None)
    np.testing.assert_array_equal(decode_payload(data, "jpeg"), fast)
