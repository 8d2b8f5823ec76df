"""The shrinking resize of crops and conversion (``imageproc.shrink_area``): the same bytes as
OpenCV's ``INTER_AREA``, through packer's C module where it applies and OpenCV elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from packer.images import imageproc  # noqa: E402
from packer.images.imageproc import shrink_area  # noqa: E402
from tests.helpers import need_optional  # noqa: E402


def _photo_like(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Smooth gradients, edges and noise: values that make rounding ties and carries likely."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255.0 / max(w - 1, 1)), (y * 255.0 / max(h - 1, 1)), ((x + y) % 64) * 4.0], -1)
    noise = rng.normal(0, 24, (h, w, 3))
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    img[h // 3 : h // 2, w // 4 : w // 2] = rng.integers(0, 2, (1, 1, 3)) * 255  # a flat block with hard edges
    return img


def _module() -> object:
    need_optional(imageproc._AREA is not None, "packer.images._jpegwindow is not built here")
    return imageproc._jpegwindow


# (source height, width) -> (output height, width): random windows' ratios (1-2.3), a side kept
# (ratio 1), a whole-number side beside a fractional one, near-whole ratios, conversion-size
# ratios (a camera photo to 256), outputs of one pixel.
SIZES = [
    ((300, 251), (224, 224)), ((224, 300), (224, 224)), ((449, 225), (224, 224)), ((448, 301), (224, 224)),
    ((513, 511), (224, 224)), ((237, 229), (224, 224)), ((500, 375), (341, 256)), ((375, 500), (256, 341)),
    ((3000, 4000), (256, 341)), ((1080, 1920), (144, 256)), ((97, 61), (1, 1)), ((97, 61), (96, 1)),
    ((7, 5), (3, 2)), ((672, 673), (224, 224)), ((225, 449), (224, 224)), ((1001, 999), (333, 222)),
]


@pytest.mark.parametrize(("src", "dst"), SIZES)
def test_module_matches_opencv_inter_area(src: tuple[int, int], dst: tuple[int, int]) -> None:
    module = _module()
    rng = np.random.default_rng(sum(src) * 7 + sum(dst))
    img = _photo_like(rng, *src)
    out = np.empty((*dst, 3), np.uint8)
    module.resize_area(img, out)  # type: ignore[attr-defined]
    want = cv2.resize(img, (dst[1], dst[0]), interpolation=cv2.INTER_AREA)
    assert np.array_equal(out, want), f"{src} -> {dst}: {int((out != want).sum())} bytes differ"


def test_module_matches_opencv_on_random_windows_of_views() -> None:
    """Windows cut from a larger image (strided rows, as a window decode returns them), at the
    ratios RandomResizedCrop draws, against OpenCV on a contiguous copy."""
    module = _module()
    rng = np.random.default_rng(5)
    big = _photo_like(rng, 600, 800)
    for _ in range(120):
        h, w = int(rng.integers(224, 600)), int(rng.integers(224, 800))
        top, left = int(rng.integers(0, 601 - h)), int(rng.integers(0, 801 - w))
        th, tw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        view = big[top : top + h, left : left + w]
        out = np.empty((th, tw, 3), np.uint8)
        module.resize_area(view, out)  # type: ignore[attr-defined]
        want = cv2.resize(np.ascontiguousarray(view), (tw, th), interpolation=cv2.INTER_AREA)
        assert np.array_equal(out, want), f"{h}x{w} -> {th}x{tw}"


def test_module_refuses_what_it_cannot_resize() -> None:
    module = _module()
    img = np.zeros((10, 10, 3), np.uint8)
    for src, out in [(img, np.empty((11, 5, 3), np.uint8)),  # larger than the source
                     (img[:, :, :2], np.empty((5, 5, 2), np.uint8)),  # not 3 channels
                     (img[:, ::2], np.empty((5, 5, 3), np.uint8)),  # pixels not contiguous
                     (img.astype(np.float32), np.empty((5, 5, 3), np.float32))]:
        with pytest.raises((ValueError, BufferError)):
            module.resize_area(src, out)  # type: ignore[attr-defined]


@pytest.mark.parametrize("built", [True, False])
def test_shrink_area_is_opencv_inter_area(monkeypatch: pytest.MonkeyPatch, built: bool) -> None:
    """With and without the module, every shape and dtype it takes or passes on to OpenCV."""
    if built:
        _module()
    else:
        monkeypatch.setattr(imageproc, "_AREA", None)
    rng = np.random.default_rng(11)
    rgb = _photo_like(rng, 333, 517)
    cases = [(rgb, 224, 224), (rgb[10:300, 7:400], 224, 201), (rgb[:, :448], 224, 111),  # whole ratio on one side
             (rgb[:224, :448], 224, 112),  # whole ratios on both: OpenCV's own path
             (rgb[..., 0].copy(), 100, 90), (rgb[..., :2].copy(), 100, 90), (rgb.astype(np.float32), 100, 90),
             (np.ascontiguousarray(rgb[:, ::-1]), 250, 300), (rgb[:, ::-1], 250, 300),  # a flipped view: OpenCV
             (rgb[::-1], 250, 300), (rgb[::2], 250, 100)]  # rows upside down or skipped: OpenCV too
    for img, w, h in cases:
        got = shrink_area(img, w, h)
        want = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), img.shape


def _folder(root) -> str:
    from tests.helpers import make_folder

    src = str(root / "src")
    make_folder(src, {"a": [(f"a{k}.jpg", 300 + 37 * k, 410 - 23 * k) for k in range(4)],
                      "b": [(f"b{k}.png", 257 + 11 * k, 333 + 29 * k) for k in range(3)]})
    return src


def test_conversion_bytes_do_not_depend_on_the_module(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--resize shorter:N writes the same payloads whether the module or OpenCV shrinks."""
    from packer.datasets import open_dataset
    from tests.helpers import pack

    _module()
    src = _folder(tmp_path)
    pack(src, str(tmp_path / "with"), "lmdb", resize="shorter:200")
    monkeypatch.setattr(imageproc, "_AREA", None)
    pack(src, str(tmp_path / "without"), "lmdb", resize="shorter:200")
    with open_dataset(str(tmp_path / "with")) as a, open_dataset(str(tmp_path / "without")) as b:
        assert len(a) == len(b) == 7
        for i in range(len(a)):
            assert bytes(a.read_record(i).payload) == bytes(b.read_record(i).payload), i


def test_random_resized_crop_reads_do_not_depend_on_the_module(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """crop=RandomResizedCrop gives the same batches, window for window, with either resize."""
    import random

    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop
    from tests.helpers import pack

    _module()
    dst = str(tmp_path / "ds")
    pack(_folder(tmp_path), dst, "lmdb", resize="shorter:256")

    def read() -> list[np.ndarray]:
        random.seed(3)
        with open_dataset(dst, crop=RandomResizedCrop(96, scale=(0.3, 1.0))) as ds:
            return [ds[i % len(ds)][0].numpy() for i in range(40)]

    fast = read()
    monkeypatch.setattr(imageproc, "_AREA", None)
    assert all(np.array_equal(x, y) for x, y in zip(fast, read(), strict=True))
