"""Reduced-scale window decodes (``RandomResizedCrop(reduced_decode=True)``, the default): the
pixels are libjpeg-turbo's scaled decode cut to the window, a window under twice the output is
never reduced, masks, extra images and boxes are cut by the same (grid-widened) window, and the
paths without the C module give the same pixels."""

from __future__ import annotations

import random

import cv2
import numpy as np
import pytest
import simplejpeg

import packer.images.imageproc as imageproc
from packer.datasets import open_dataset
from packer.datasets.crops import RandomResizedCrop
from packer.fields.boxes import move_boxes
from packer.images.imageproc import (
    decode_payload,
    decode_payload_window,
    reduced_window,
    window_decoding,
)
from tests.datasets.test_crop import KINDS, _with_orientation, jpeg, need_module
from tests.helpers import draw, import_optional, make_folder, pack, psnr, write_fields_dataset

PHOTO = cv2.cvtColor(draw(np.random.default_rng(7), 203, 317), cv2.COLOR_RGB2BGR)


def scaled_whole(data: bytes, scale: int) -> np.ndarray:
    """TurboJPEG's decode of the whole JPEG at 1/scale (the reference the window decode must equal)."""
    h, w = simplejpeg.decode_jpeg_header(data)[:2]
    out = simplejpeg.decode_jpeg(data, colorspace="rgb", min_height=-(-h // scale), min_width=-(-w // scale))
    assert out.shape[:2] == (-(-h // scale), -(-w // scale))
    return out


def box(window, scale):
    top, left, h, w = window
    t, x0 = top // scale, left // scale
    return slice(t, -(-(top + h) // scale)), slice(x0, -(-(left + w) // scale))


def windows(rng, height, width, n=12):
    for _ in range(n):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scale", [2, 4, 8])
def test_scaled_window_decode_is_turbojpegs_scaled_decode_cut(kind, scale):
    need_module()
    data = jpeg(PHOTO, KINDS[kind])
    whole = scaled_whole(data, scale)
    rng = np.random.default_rng(scale)
    for window in [(0, 0, 203, 317), (202, 316, 1, 1), *windows(rng, 203, 317)]:
        got = decode_payload_window(data, "jpeg", 203, 317, lambda h, w, window=window: window, scale=scale)
        np.testing.assert_array_equal(got, whole[box(window, scale)], err_msg=f"{kind} 1/{scale} {window}")


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_without_the_c_module_the_scaled_pixels_are_the_same(scale, monkeypatch):
    data = jpeg(PHOTO)
    rng = np.random.default_rng(3)
    want = [decode_payload_window(data, "jpeg", 203, 317, lambda h, w, c=c: c, scale=scale)
            for c in windows(rng, 203, 317, 6)]
    monkeypatch.setattr(imageproc, "_jpegwindow", None)
    assert not window_decoding()
    rng = np.random.default_rng(3)
    for c, w in zip(windows(rng, 203, 317, 6), want):
        np.testing.assert_array_equal(decode_payload_window(data, "jpeg", 203, 317, lambda h, w, c=c: c,
                                                            scale=scale), w)


def test_without_turbojpeg_the_whole_decode_is_shrunk_to_the_scale(monkeypatch):
    """The last fallback (no C module, no simplejpeg, or an oriented JPEG): the whole decode shrunk
    by INTER_AREA, close to the scaled decode but not equal (on this synthetic picture, full of
    fine detail, about 26 dB PSNR; on photos 34-52 dB, docs/benchmarks.md section 14)."""
    data = jpeg(PHOTO)
    window = (10, 21, 150, 240)
    want = decode_payload_window(data, "jpeg", 203, 317, lambda h, w: window, scale=2)
    monkeypatch.setattr(imageproc, "_jpegwindow", None)
    monkeypatch.setattr(imageproc, "_simplejpeg", None)
    got = decode_payload_window(data, "jpeg", 203, 317, lambda h, w: window, scale=2)
    area = cv2.resize(decode_payload(data, "jpeg"), (159, 102), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(got, area[box(window, 2)])
    assert got.shape == want.shape and psnr(got, want) > 24


def test_reduced_decode_takes_only_jpegs_and_its_scales():
    with pytest.raises(ValueError, match="JPEG and a scale"):
        decode_payload_window(np.zeros(12, np.uint8).tobytes(), "raw", 2, 2, lambda h, w: (0, 0, 2, 2), scale=2)
    with pytest.raises(ValueError, match="JPEG and a scale"):
        decode_payload_window(jpeg(PHOTO), "jpeg", 203, 317, lambda h, w: (0, 0, 8, 8), scale=3)


def test_the_scale_is_the_largest_that_keeps_the_output_and_under_twice_never_reduces():
    assert reduced_window((0, 0, 447, 1000), 500, 1000, 224, 224) == (1, (0, 0, 447, 1000))
    assert reduced_window((0, 0, 1000, 447), 1000, 1000, 224, 224)[0] == 1
    assert reduced_window((0, 0, 448, 448), 500, 500, 224, 224) == (2, (0, 0, 448, 448))
    assert reduced_window((0, 0, 900, 1800), 900, 1800, 224, 224)[0] == 4
    assert reduced_window((0, 0, 1792, 1792), 1792, 1792, 224, 224)[0] == 8
    assert reduced_window((0, 0, 1792, 1792), 1792, 1792, 224, 225)[0] == 4
    rng = np.random.default_rng(0)
    for window in windows(rng, 301, 413, 300):
        scale, (t, x0, h, w) = reduced_window(window, 301, 413, 20, 30)
        top, left, wh, ww = window
        if wh < 2 * 20 or ww < 2 * 30:
            assert (scale, (t, x0, h, w)) == (1, window)
            continue
        assert wh >= scale * 20 and ww >= scale * 30 and (scale == 8 or wh < 2 * scale * 20 or ww < 2 * scale * 30)
        # widened outwards to the scale's grid, by less than the scale, inside the image
        assert t % scale == 0 and x0 % scale == 0 and 0 <= top - t < scale and 0 <= left - x0 < scale
        assert t + h == 301 or (t + h) % scale == 0
        assert x0 + w == 413 or (x0 + w) % scale == 0
        assert 0 <= t + h - (top + wh) < scale and 0 <= x0 + w - (left + ww) < scale
        assert RandomResizedCrop((20, 30)).reduction(window, 301, 413) == (scale, (t, x0, h, w))
        assert RandomResizedCrop((20, 30), reduced_decode=False).reduction(window, 301, 413) == (1, window)


# -- the readers --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """JPEG and PNG datasets of 8 images 150-260 px a side."""
    root = tmp_path_factory.mktemp("reduced")
    rng = np.random.default_rng(4)
    make_folder(str(root / "src"), {c: [(f"{c}{i}.jpg", int(rng.integers(150, 260)), int(rng.integers(150, 260)))
                                        for i in range(4)] for c in ("a", "b")})
    pack(str(root / "src"), str(root / "jpeg"), "lmdb")
    pack(str(root / "src"), str(root / "hdf5"), "hdf5")
    pack(str(root / "src"), str(root / "png"), "tar", encode="png")
    return {"jpeg": str(root / "jpeg"), "hdf5": str(root / "hdf5"), "png": str(root / "png")}


def expected(ds, i, seed, crop):
    """Sample i's image as the reduced decode makes it, by hand: the window drawn with the seed,
    the scale and the widened window, TurboJPEG's scaled decode cut and shrunk."""
    rec = ds.read_record(i)
    random.seed(seed)
    scale, window = crop.reduction(crop.window(rec.height, rec.width), rec.height, rec.width)
    if scale == 1:
        pixels = decode_payload(rec.payload, "jpeg")[window[0]:window[0] + window[2], window[1]:window[1] + window[3]]
    else:
        pixels = scaled_whole(bytes(rec.payload), scale)[box(window, scale)]
    return scale, crop.finish(pixels)


@pytest.mark.parametrize(("name", "cache"), [("jpeg", None), ("jpeg", "encoded"), ("hdf5", None)])
def test_reader_gives_the_scaled_decodes_pixels_close_to_the_whole_decodes(big, name, cache):
    crop = RandomResizedCrop(48)
    scales = set()
    with open_dataset(big[name], crop=crop, output="numpy", cache=cache) as ds:
        for _ in range(2):
            for i in range(len(ds)):
                random.seed(i)
                got = ds[i][0]
                scale, want = expected(ds, i, i, crop)
                scales.add(scale)
                np.testing.assert_array_equal(got, want)
                assert got.shape == (48, 48, 3)
                rec = ds.read_record(i)
                random.seed(i)
                t, x0, h, w = crop.reduction(crop.window(rec.height, rec.width), rec.height, rec.width)[1]
                # the same window decoded whole and shrunk: close (this synthetic picture's fine
                # detail is a hard case; photos: docs/benchmarks.md section 14)
                assert psnr(got, crop.finish(decode_payload(rec.payload, "jpeg")[t:t + h, x0:x0 + w])) > 30
        got = ds.__getitems__(list(range(len(ds))))
        assert all(g[0].shape == (48, 48, 3) for g in got)
    assert 1 in scales and max(scales) > 1


def test_reduced_decode_applies_to_jpegs_only_and_can_be_turned_off(big):
    png_crop = RandomResizedCrop(48, scale=(0.9, 1.0))
    with open_dataset(big["png"], crop=png_crop, output="numpy") as ds:
        for i in range(len(ds)):
            random.seed(i)
            got = ds[i][0]
            rec = ds.read_record(i)
            random.seed(i)
            t, x0, h, w = png_crop.window(rec.height, rec.width)
            np.testing.assert_array_equal(got, png_crop.finish(decode_payload(rec.payload, "png")[t:t + h, x0:x0 + w]))
    off = RandomResizedCrop(48, scale=(0.9, 1.0), reduced_decode=False)
    assert "reduced_decode=False" in repr(off) and "reduced" not in repr(png_crop)
    with open_dataset(big["jpeg"], crop=off, output="numpy") as ds:
        random.seed(1)
        got = ds[1][0]
        rec = ds.read_record(1)
        random.seed(1)
        t, x0, h, w = off.window(rec.height, rec.width)
        np.testing.assert_array_equal(got, off.finish(decode_payload(rec.payload, "jpeg")[t:t + h, x0:x0 + w]))


def test_masks_extra_images_and_boxes_follow_the_widened_window(tmp_path):
    dst = tmp_path / "f.lmdb"
    write_fields_dataset(dst, "lmdb", n=6, resize="none", encode="jpeg:90")
    crop = RandomResizedCrop(10, scale=(0.4, 1.0))
    fields = ("image", "mask", "left", "boxes", "box_labels")
    scales = set()
    with open_dataset(dst, fields=fields, crop=crop, output="numpy") as ds, \
            open_dataset(dst, fields=fields, output="numpy") as plain:
        for i in range(len(ds)):
            random.seed(50 + i)
            image, mask, left, boxes, labels = ds[i]
            _, wmask, _, wboxes, wlabels = plain[i]
            rec = ds.read_record(i)
            random.seed(50 + i)
            scale, (t, x0, h, w) = crop.reduction(crop.window(rec.height, rec.width), rec.height, rec.width)
            scales.add(scale)
            np.testing.assert_array_equal(mask, cv2.resize(wmask[t:t + h, x0:x0 + w], (10, 10),
                                                           interpolation=cv2.INTER_NEAREST))
            if scale > 1:  # the scaled pixels show exactly the widened window
                assert scaled_whole(bytes(rec.payload), scale)[box((t, x0, h, w), scale)].shape[:2] == \
                    (-(-h // scale), -(-w // scale))
                np.testing.assert_array_equal(left, crop.finish(
                    scaled_whole(bytes(rec.fields[1].payload), scale)[box((t, x0, h, w), scale)]))
            assert image.shape == left.shape == (10, 10, 3)
            want_boxes, want_labels = move_boxes(wboxes, wlabels, (t, x0, h, w), (10, 10))
            np.testing.assert_allclose(boxes, want_boxes, atol=1e-4)
            np.testing.assert_array_equal(labels, want_labels)
    assert max(scales) > 1


def test_linear_interpolation_resizes_every_window_bilinearly():
    pixels = draw(np.random.default_rng(2), 60, 80)
    crop = RandomResizedCrop((20, 30), interpolation="linear")
    np.testing.assert_array_equal(crop.finish(pixels[:40, :60]),
                                  cv2.resize(pixels[:40, :60], (30, 20), interpolation=cv2.INTER_LINEAR))
    assert "interpolation='linear'" in repr(crop)
    with pytest.raises(ValueError, match="interpolation"):
        RandomResizedCrop(8, interpolation="cubic")


def test_a_decoded_cache_holds_whole_decodes_and_never_reduces(big):
    crop = RandomResizedCrop(48, scale=(0.9, 1.0))
    with open_dataset(big["jpeg"], crop=crop, output="numpy", cache="decoded") as ds:
        for _ in range(2):  # filled, then read
            for i in range(len(ds)):
                random.seed(i)
                got = ds[i][0]
                rec = ds.read_record(i)
                random.seed(i)
                t, x0, h, w = crop.window(rec.height, rec.width)
                assert crop.reduction((t, x0, h, w), rec.height, rec.width)[0] > 1  # it would reduce uncached
                np.testing.assert_array_equal(got, crop.finish(decode_payload(rec.payload, "jpeg")[t:t + h, x0:x0 + w]))


def test_an_oriented_jpeg_is_decoded_whole_turned_and_shrunk_to_the_scale():
    turned = _with_orientation(jpeg(PHOTO), 6)  # shown 317 x 203
    crop = RandomResizedCrop(20)
    got = decode_payload_window(turned, "jpeg", 317, 203, lambda h, w: (5, 3, 300, 190), reduce=crop.reduction)
    whole = decode_payload(turned, "jpeg")
    assert whole.shape[:2] == (317, 203)
    scale, window = crop.reduction((5, 3, 300, 190), 317, 203)
    assert scale == 8
    area = cv2.resize(whole, (-(-203 // 8), -(-317 // 8)), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(got, area[box(window, 8)])


def test_antialias_interpolation_is_torchs_antialiased_bilinear_resize():
    import torch
    from torch.nn.functional import interpolate

    pixels = draw(np.random.default_rng(3), 90, 120)
    crop = RandomResizedCrop((20, 30), interpolation="antialias")
    for window in (pixels[5:75, 7:107], pixels[:10, :12]):  # a view of wider rows; an enlargement
        want = interpolate(torch.from_numpy(np.ascontiguousarray(window)).permute(2, 0, 1)[None].float(),
                           size=(20, 30), mode="bilinear", antialias=True, align_corners=False)
        got = crop.finish(window)
        assert got.shape == (20, 30, 3) and got.dtype == np.uint8
        assert np.abs(got.astype(int) - want[0].permute(1, 2, 0).numpy()).max() <= 1  # uint8 rounding


def test_antialias_interpolation_equals_torchvisions_resize():
    import torch

    import_optional("torchvision", "torchvision is not installed")
    from torchvision.transforms.v2 import functional

    crop = RandomResizedCrop((20, 30), interpolation="antialias")
    window = draw(np.random.default_rng(3), 90, 120)[5:75, 7:107]
    tv = functional.resize(torch.from_numpy(np.ascontiguousarray(window)).permute(2, 0, 1), size=[20, 30],
                           antialias=True).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(crop.finish(window), tv)  # torchvision's RandomResizedCrop kernel


def test_opencv_fused_v2_crop_reduces_as_crop_does_and_keeps_the_windows(big):
    import torch

    import_optional("torchvision", "torchvision is not installed")
    from torchvision.transforms import v2

    step = v2.RandomResizedCrop(48)
    with open_dataset(big["jpeg"], transform=step, fuse_crop="opencv") as fast, \
            open_dataset(big["jpeg"], transform=step) as exact:
        crop = fast.crop
        assert crop.reduces and not exact.crop.reduces  # torchvision's pixels are never reduced
        scales = set()
        for i in range(len(fast)):
            rec = fast.read_record(i)
            torch.manual_seed(i)
            drawn = crop.window(rec.height, rec.width)
            after = torch.rand(1)
            scale, widened = crop.reduction(drawn, rec.height, rec.width)
            scales.add(scale)
            if scale == 1:
                t, x0, h, w = widened
                pixels = decode_payload(rec.payload, "jpeg")[t:t + h, x0:x0 + w]
            else:
                pixels = scaled_whole(bytes(rec.payload), scale)[box(widened, scale)]
            torch.manual_seed(i)
            got = fast[i][0]
            assert torch.equal(torch.rand(1), after)  # the generator left as the step leaves it
            np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), crop.finish(pixels))
            torch.manual_seed(i)
            assert exact.crop.window(rec.height, rec.width) == drawn  # the same window as v2 draws
    assert 1 in scales and max(scales) > 1
