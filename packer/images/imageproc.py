"""The image pipeline: decode, orient, convert to 8-bit RGB, resize, encode (and decode again on read).

One module so that the converter and every reader agree on colour order and codecs. Images are
stored RGB; OpenCV works in BGR, so pixels are kept BGR up to the encoder (which expects BGR) and
turned RGB only for ``raw`` storage and on read (``IMREAD_COLOR_RGB`` decodes straight to RGB).
"""

from __future__ import annotations

import functools
import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

try:  # libjpeg-turbo's TurboJPEG API; optional at run time (the reader falls back to OpenCV)
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - installed with packer; absent only on platforms without a wheel
    _simplejpeg = None

try:  # packer's own C module (setup.py): a JPEG's crop window decoded alone; optional
    if os.environ.get("PACKER_NO_EXTENSION") == "1":  # as at install: run as if it were not built
        raise ImportError("PACKER_NO_EXTENSION=1")
    from . import _jpegwindow
except ImportError:  # built without a C compiler or libjpeg-turbo headers: whole decodes, then crop
    _jpegwindow = None

from ..errors import CorruptDataError, ImageError
from .codecs import TAR_EXTENSIONS
from .imageheader import ImageInfo, describe_non_image, sniff
from .jpegscan import (
    JpegFrame,
    jpeg_frame,
    jpeg_oriented,
    jpeg_truncation,
    libjpeg_warnings,
    refuse_truncated,
)

_AREA = getattr(_jpegwindow, "resize_area", None)  # the module's INTER_AREA shrink (shrink_area)

__all__ = [
    "Resize",
    "Encoding",
    "ProcessOptions",
    "above_pixel_limit",
    "ProcessedImage",
    "ProcessedField",
    "CODECS",
    "parse_resize",
    "parse_encoding",
    "target_size",
    "reduction_factor",
    "REDUCED_DECODE_MARGIN",
    "process_image",
    "decode_payload",
    "decode_payload_window",
    "reduced_window",
    "READ_SCALES",
    "crop_window",
    "shrink_area",
    "window_decoding",
    "window_decoder_version",
    "WINDOW_DECODER_MINIMUM",
    "jpeg_truncation",
    "check_encoded",
    "libjpeg_warnings",
    "DEFAULT_MAX_PIXELS",
]

#: Refuse images above this many pixels before decoding (PIL's hard limit; 13k x 13k).
DEFAULT_MAX_PIXELS = 178_956_970

#: Payload codecs a packed sample can have, and the file extension each uses in tar shards.
CODECS = TAR_EXTENSIONS


@dataclass(frozen=True)
class Resize:
    """A resize policy: ``shorter:N``, ``longer:N``, ``WxH`` (mode ``exact``) or ``none``."""

    mode: str = "none"
    size: int = 0
    width: int = 0
    height: int = 0

    def __str__(self) -> str:
        if self.mode == "none":
            return "none"
        if self.mode == "exact":
            return f"{self.width}x{self.height}"
        return f"{self.mode}:{self.size}"


@dataclass(frozen=True)
class Encoding:
    """How pixels are stored: ``jpeg:Q``, ``webp:Q``, ``png``, ``raw`` or ``keep``."""

    codec: str = "jpeg"
    quality: int = 90

    def __str__(self) -> str:
        return f"{self.codec}:{self.quality}" if self.codec in ("jpeg", "webp") else self.codec


@dataclass(frozen=True)
class ProcessOptions:
    """Everything that decides the stored pixels; recorded in the manifest."""

    resize: Resize = Resize()
    encoding: Encoding = Encoding()
    upscale: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    #: Let libjpeg decode at 1/2, 1/4 or 1/8 scale while the result stays at least
    #: :data:`REDUCED_DECODE_MARGIN` times the target. 2.5-6x faster for camera-size JPEGs; the
    #: result is then resized with INTER_AREA as usual.
    reduced_decode: bool = True
    #: Keep JPEGs that libjpeg decodes with a warning (damaged data it papers over with grey or
    #: repeated blocks). Off by default: such files are skipped with the warning as the reason.
    keep_damaged_jpeg: bool = False

    @property
    def max_source_bytes(self) -> int:
        """The most bytes read from one source file: what an uncompressed image of ``max_pixels``
        can take (16 bytes a pixel: four 32-bit channels) plus 64 MiB of metadata. Larger files
        are skipped unread, so a huge or endless file cannot exhaust memory."""
        return self.max_pixels * 16 + (64 << 20)

    def to_json(self) -> dict:
        """The manifest's ``processing`` entry."""
        return {
            "resize": str(self.resize),
            "encoding": str(self.encoding),
            "upscale": self.upscale,
            "max_pixels": self.max_pixels,
            "reduced_decode": self.reduced_decode,
            **({"reduced_decode_margin": REDUCED_DECODE_MARGIN} if self.reduced_decode else {}),
            "color": "RGB",
            "interpolation": "INTER_AREA when shrinking, INTER_CUBIC when enlarging",
            **({"keep_damaged_jpeg": True} if self.keep_damaged_jpeg else {}),
        }


@dataclass(frozen=True)
class ProcessedField:
    """A field of a sample besides its image (:mod:`packer.images.fields`): a mask (``png``, 1
    channel, ``depth`` 8 or 16 bits) or an extra image (3 channels, 8 bits), as stored."""

    name: str
    codec: str
    payload: bytes
    height: int
    width: int
    channels: int = 3
    depth: int = 8


@dataclass(frozen=True)
class ProcessedImage:
    """One processed sample: payload bytes in ``codec``, and the stored pixel size; with its
    other fields (masks, extra images), and boxes (``[x0, y0, x1, y1]`` in stored pixels) with
    their labels, when it has them."""

    codec: str
    payload: bytes
    height: int
    width: int
    channels: int = 3
    fields: tuple[ProcessedField, ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[int, ...] | None = None


def parse_resize(text: str) -> Resize:
    """Parse ``shorter:256``, ``longer:512``, ``224x224`` or ``none``; ValueError otherwise."""
    t = text.strip().lower()
    if t == "none":
        return Resize()
    m = re.fullmatch(r"(shorter|longer):(\d+)", t)
    if m and int(m.group(2)) > 0:
        return Resize(m.group(1), int(m.group(2)))
    m = re.fullmatch(r"(\d+)x(\d+)", t)
    if m and int(m.group(1)) > 0 and int(m.group(2)) > 0:
        return Resize("exact", 0, int(m.group(1)), int(m.group(2)))
    raise ValueError(f"bad resize policy {text!r}: use shorter:N, longer:N, WxH or none")


def parse_encoding(text: str) -> Encoding:
    """Parse ``jpeg:90``, ``webp:85``, ``png``, ``raw``, ``keep`` (``jpeg`` alone means quality 90)."""
    t = text.strip().lower()
    m = re.fullmatch(r"(jpeg|jpg|webp)(?::(\d+))?", t)
    if m:
        q = int(m.group(2)) if m.group(2) else 90
        if not 1 <= q <= 100:
            raise ValueError(f"bad encoding {text!r}: quality must be 1..100")
        return Encoding("jpeg" if m.group(1) in ("jpeg", "jpg") else "webp", q)
    if t in ("png", "raw", "keep"):
        return Encoding(t, 0)
    raise ValueError(f"bad encoding {text!r}: use jpeg:Q, webp:Q, png, raw or keep")


def target_size(width: int, height: int, resize: Resize, upscale: bool = False) -> tuple[int, int]:
    """Return the stored (width, height) for a source of ``width`` x ``height``.

    ``shorter:N`` sets the shorter side to N and the longer to ``int(N * long / short)``, the same
    arithmetic as torchvision's ``Resize(N)``. Without ``upscale`` an image is never enlarged
    (it is kept as is); ``WxH`` is an explicit shape and is always honoured.
    """
    if resize.mode == "none":
        return width, height
    if resize.mode == "exact":
        return resize.width, resize.height
    short, long_ = min(width, height), max(width, height)
    if resize.mode == "shorter":
        if short <= resize.size and not upscale:
            return width, height
        new_short, new_long = resize.size, max(1, int(resize.size * long_ / short))
    else:  # longer
        if long_ <= resize.size and not upscale:
            return width, height
        new_long, new_short = resize.size, max(1, int(resize.size * short / long_))
    return (new_short, new_long) if width <= height else (new_long, new_short)


_REDUCED = {8: cv2.IMREAD_REDUCED_COLOR_8, 4: cv2.IMREAD_REDUCED_COLOR_4, 2: cv2.IMREAD_REDUCED_COLOR_2}

#: Reduced-size decoding keeps the decoded image at least this many times the target on both
#: sides, as Pillow's ``thumbnail`` does with its default ``reducing_gap``. Measured on
#: camera-size JPEGs (docs/benchmarks.md, section 10): decoding just above the target (a margin
#: of 1) left the worst images 28-35 dB PSNR from a full decode, about what storing them as JPEG
#: q90 loses, for 7-37% more speed than a margin of 2 (worst images 36-43 dB, still 2.5-6x
#: faster than a full decode). Recorded in the manifest's ``processing`` as
#: ``reduced_decode_margin``.
REDUCED_DECODE_MARGIN = 2


def reduction_factor(width: int, height: int, target_width: int, target_height: int,
                     margin: float = REDUCED_DECODE_MARGIN) -> int:
    """The largest of 8, 4, 2 by which a ``width`` x ``height`` JPEG can be decoded (libjpeg's
    reduced-size IDCT) while staying at least ``margin`` times the target on both sides; 1 if
    none can."""
    for factor in _REDUCED:
        if width // factor >= margin * target_width and height // factor >= margin * target_height:
            return factor
    return 1


def _decode_flag(info: ImageInfo, opts: ProcessOptions, tw: int, th: int) -> int:
    """Pick full or DCT-reduced decoding (:func:`reduction_factor`) for a ``tw`` x ``th`` target."""
    if not opts.reduced_decode or info.format != "jpeg" or opts.resize.mode == "none":
        return cv2.IMREAD_COLOR_BGR
    w, h = (info.height, info.width) if info.orientation >= 5 else (info.width, info.height)
    return _REDUCED.get(reduction_factor(w, h, tw, th), cv2.IMREAD_COLOR_BGR)


def _keepable(info: ImageInfo, data: bytes, tw: int, th: int) -> bool:
    """Original bytes may be stored as is: no resize, upright, 8-bit 3-channel JPEG or PNG."""
    return (
        (tw, th) == (info.width, info.height)
        and info.orientation == 1
        and info.format in ("jpeg", "png")
        and info.channels == 3
        and info.bit_depth == 8
        and not (info.format == "png" and data[25:26] == b"\x03")  # palette PNG
    )


def _encode(bgr: np.ndarray, codec: str, quality: int) -> bytes:
    if codec == "jpeg":
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    elif codec == "webp":
        ok, buf = cv2.imencode(".webp", bgr, [cv2.IMWRITE_WEBP_QUALITY, quality])
    elif codec == "png":
        ok, buf = cv2.imencode(".png", bgr)
    else:
        raise ValueError(f"cannot encode to {codec!r}")
    if not ok:
        raise ImageError(f"OpenCV could not encode the image as {codec}")
    return buf.tobytes()


def above_pixel_limit(info: ImageInfo, max_pixels: int) -> str:
    """Why a file whose header says ``info`` is refused by the pixel limit (before any decode)."""
    return (f"{info.width}x{info.height} = {info.pixels} pixels is above the limit of {max_pixels} "
            f"(a decompression bomb?); raise --max-pixels to allow it")


def process_image(data: bytes, opts: ProcessOptions, size: tuple[int, int] | None = None) -> ProcessedImage:
    """Turn one source file's bytes into a stored sample, resized as ``opts`` say or to ``size``
    (width, height: an extra image made the size of its sample's image). Raises ImageError with
    the reason."""
    info = sniff(data)
    if info is None:
        raise ImageError(describe_non_image(data))
    if info.width <= 0 or info.height <= 0:
        raise ImageError(f"header says {info.width}x{info.height} pixels")
    if info.pixels > opts.max_pixels:
        raise ImageError(above_pixel_limit(info, opts.max_pixels))
    if info.format == "jpeg":
        refuse_truncated(data, opts.keep_damaged_jpeg)
    # Size after EXIF orientation (OpenCV applies it), before any DCT reduction.
    full_w, full_h = (info.height, info.width) if info.orientation >= 5 else (info.width, info.height)
    tw, th = size or target_size(full_w, full_h, opts.resize, opts.upscale)
    if tw * th > opts.max_pixels:  # --upscale can ask for more than any source has
        raise ImageError(f"the output would be {tw}x{th} = {tw * th} pixels, above the limit of {opts.max_pixels}; "
                         f"raise --max-pixels to allow it")
    buf = np.frombuffer(data, np.uint8)
    if info.format == "jpeg" and not opts.keep_damaged_jpeg:
        with libjpeg_warnings() as warnings:
            bgr = cv2.imdecode(buf, _decode_flag(info, opts, tw, th))
        if warnings:
            raise ImageError(f"damaged JPEG: libjpeg warns {warnings[0]!r} (--keep-damaged-jpeg keeps such files)")
    else:
        bgr = cv2.imdecode(buf, _decode_flag(info, opts, tw, th))
    if bgr is None or bgr.size == 0:
        raise ImageError(f"OpenCV could not decode this {info.format} file (corrupt or truncated)")
    h, w = bgr.shape[:2]
    codec = opts.encoding.codec
    if codec == "keep":
        if _keepable(info, data, tw, th):
            return ProcessedImage(info.format, data, th, tw)
        codec = "jpeg" if info.format == "jpeg" else "png"
    if (tw, th) != (w, h):
        if tw <= w and th <= h:
            bgr = shrink_area(bgr, tw, th)
        else:
            bgr = cv2.resize(bgr, (tw, th), interpolation=cv2.INTER_CUBIC)
    if codec == "raw":
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        return ProcessedImage("raw", rgb.tobytes(), th, tw)
    quality = opts.encoding.quality if opts.encoding.codec != "keep" else 90
    return ProcessedImage(codec, _encode(bgr, codec, quality), th, tw)


def check_encoded(data: bytes, keep_damaged_jpeg: bool = False) -> tuple[int, int]:
    """Check bytes that are to be stored unchanged (a copy from another tool's shards) as
    :func:`process_image` checks a source file; return their (height, width) as decoded (EXIF
    orientation applied). Raises ImageError with the reason. JPEGs are decoded once to catch
    damage libjpeg only warns about, unless ``keep_damaged_jpeg``."""
    info = sniff(data)
    if info is None:
        raise ImageError(describe_non_image(data))
    if info.width <= 0 or info.height <= 0:
        raise ImageError(f"header says {info.width}x{info.height} pixels")
    if info.format == "jpeg":
        refuse_truncated(data, keep_damaged_jpeg)
    if info.format == "jpeg" and not keep_damaged_jpeg:
        with libjpeg_warnings() as warnings:
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_8)
        if bgr is None:
            raise ImageError("OpenCV could not decode this jpeg file (corrupt or truncated)")
        if warnings:
            raise ImageError(f"damaged JPEG: libjpeg warns {warnings[0]!r} (--keep-damaged-jpeg keeps such files)")
    return (info.width, info.height) if info.orientation >= 5 else (info.height, info.width)


def decode_payload(
    payload: bytes | memoryview,
    codec: str,
    height: int = 0,
    width: int = 0,
    *,
    path: str | None = None,
    sample: int | str | None = None,
) -> np.ndarray:
    """Decode a stored payload to an RGB ``uint8`` array of shape (H, W, 3) that the caller owns.

    ``raw`` payloads need ``height`` and ``width``; a size mismatch or an undecodable payload
    raises CorruptDataError naming ``path`` and ``sample``. A ``raw`` payload in a *writable*
    buffer (the readers' fresh read buffers) is taken as the caller's own and wrapped without a
    copy; read-only ones (``bytes``, cache views) are copied.
    """
    if len(payload) == 0:
        raise CorruptDataError("empty image payload (0 bytes)", path=path, sample=sample)
    if codec == "raw":
        if len(payload) != height * width * 3:
            raise CorruptDataError(
                f"raw payload has {len(payload)} bytes, expected {height}x{width}x3",
                path=path, sample=sample,
            )
        pixels = np.frombuffer(payload, np.uint8).reshape(height, width, 3)
        return pixels if pixels.flags.writeable else pixels.copy()
    if codec == "jpeg":
        rgb = _turbo_decode(payload)
        if rgb is not None:
            return rgb
    try:
        rgb = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR_RGB)
    except cv2.error as e:
        raise CorruptDataError(f"cannot decode {codec} payload of {len(payload)} bytes ({str(e).strip()[-120:]})",
                               path=path, sample=sample) from None
    if rgb is None:
        raise CorruptDataError(f"cannot decode {codec} payload of {len(payload)} bytes", path=path, sample=sample)
    return rgb


#: (top, left, height, width) of a crop in an image.
Window = tuple[int, int, int, int]
#: Columns beyond a window's width that libjpeg may decode around it: one iMCU (up to 32 px) of
#: margin each side, and up to one more where the left edge is rounded down to an iMCU boundary.
_WINDOW_SLACK = 96


#: The oldest libjpeg-turbo the window decode is used with: the version its pixels were checked
#: against whole decodes with (tests/datasets/test_crop.py). Built against an older one, packer decodes
#: whole images and crops them.
WINDOW_DECODER_MINIMUM = (2, 1, 5)

#: JPEG frames the window decode takes: Huffman-coded baseline, extended and progressive (SOF0,
#: SOF1, SOF2), where its pixels are proven equal to a whole decode's. Arithmetic-coded and other
#: frames are decoded whole and cut.
_WINDOW_FRAMES = frozenset({0xC0, 0xC1, 0xC2})


def window_decoder_version() -> str | None:
    """The libjpeg-turbo version packer's crop-window module was built against ("2.1.5"), or None
    where the module is not built."""
    if _jpegwindow is None:
        return None
    return getattr(_jpegwindow, "libjpeg_turbo", "") or None


def window_decoding() -> bool:
    """Whether JPEG crop windows are decoded alone here: packer's C module ``_jpegwindow`` was
    built, against libjpeg-turbo :data:`WINDOW_DECODER_MINIMUM` or newer. Otherwise whole images
    are decoded and cropped (the same pixels)."""
    version = window_decoder_version()
    return version is not None and _at_least(version, WINDOW_DECODER_MINIMUM)


@functools.lru_cache(maxsize=4)
def _at_least(version: str, minimum: tuple[int, ...]) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:3]) >= minimum
    except ValueError:
        return False


#: The reduced scales a crop's window decode may use, largest first: libjpeg-turbo's reduced-size
#: inverse DCT at 1/8, 1/4 and 1/2 of the image's size.
READ_SCALES = (8, 4, 2)


def reduced_window(window: Window, height: int, width: int, out_height: int, out_width: int) -> tuple[int, Window]:
    """(scale, window) for decoding ``window`` of a ``height`` x ``width`` JPEG at a reduced scale
    before it is resized to ``out_height`` x ``out_width``: the largest of :data:`READ_SCALES`
    that leaves the window at least the output's size on both sides (so a window under twice the
    output never reduces: scale 1, the window as it is), and the window widened to the scale's
    pixel grid (its edges moved outwards by less than ``scale`` pixels, inside the image), which
    is the part of the image the scaled pixels show: cut masks and move boxes by it."""
    top, left, h, w = window
    for scale in READ_SCALES:
        if h >= scale * out_height and w >= scale * out_width:
            break
    else:
        return 1, window
    t, x0 = top // scale * scale, left // scale * scale
    b, r = min(-(-(top + h) // scale) * scale, height), min(-(-(left + w) // scale) * scale, width)
    return scale, (t, x0, b - t, r - x0)


def decode_payload_window(
    payload: bytes | memoryview,
    codec: str,
    height: int,
    width: int,
    window: Callable[[int, int], Window],
    *,
    scale: int = 1,
    reduce: Callable[[Window, int, int], tuple[int, Window]] | None = None,
    path: str | None = None,
    sample: int | str | None = None,
) -> np.ndarray:
    """The pixels of one crop window of a stored payload: ``decode_payload(...)`` cut to
    ``window(H, W)`` (called once, with the image's height and width), equal pixel for pixel.

    A Huffman-coded JPEG (baseline or progressive) is decoded alone in its window where
    :func:`window_decoding` (libjpeg-turbo skips the inverse DCT, upsampling and colour conversion
    of what lies outside it, and everything below it). The window is placed by the JPEG's own
    frame header, whatever ``height`` and ``width`` (the sizes stored beside it) say. Payloads it
    refuses (an EXIF orientation to apply, arithmetic coding, damage, CMYK, 12-bit) and other
    codecs are decoded whole and cut. The result may be a view (of the decode's wider rows, or of a
    ``raw`` payload's writable buffer), rows strided like any crop's.

    ``scale`` 2, 4 or 8 (a JPEG only; :func:`reduced_window` picks it): the pixels of the image
    decoded at 1/``scale`` of its size by libjpeg-turbo's reduced-size IDCT (TurboJPEG's scaled
    decode), cut to the window's scaled rectangle (its edges rounded outwards to whole scaled
    pixels): ``ceil((top + h) / scale) - top // scale`` rows, and so on for the columns. Where the
    window decode is not used, TurboJPEG decodes the whole image at that scale (the same pixels);
    without TurboJPEG, or for a payload it refuses (EXIF orientation, damage, CMYK), the whole
    decode is shrunk by OpenCV's ``INTER_AREA`` to the scaled size (close pixels, not equal).
    ``reduce`` (a JPEG only): ``reduce(window, H, W) -> (scale, window)`` picks the scale and the
    window to decode instead (a crop's ``reduction``) once ``window(H, W)`` is drawn.
    Errors as :func:`decode_payload`; a window outside the image raises ValueError.
    """
    frame = jpeg_frame(payload) if codec == "jpeg" else None  # walked once, for both uses below
    if reduce is not None and codec == "jpeg":
        upright = frame is not None and not frame.oriented and frame.height > 0 and frame.width > 0
        full = (frame.height, frame.width) if upright else (height, width)  # type: ignore[union-attr]
        scale, drawn = reduce(_checked_window(window, *full, path, sample), *full)
        window = lambda h, w: drawn  # noqa: E731 - the drawn window, checked again against the decode
    if scale != 1:
        if codec != "jpeg" or scale not in READ_SCALES:
            raise ValueError(f"{_where(path, sample)}: a reduced decode takes a JPEG and a scale of 2, 4 or 8, "
                             f"not {codec} at {scale}")
        return _scaled_window(payload, height, width, window, scale, path, sample, frame)
    if codec == "jpeg" and window_decoding():
        if (frame is not None and frame.marker in _WINDOW_FRAMES and not frame.oriented and frame.height > 0
                and frame.width > 0):
            top, left, h, w = _checked_window(window, frame.height, frame.width, path, sample)
            # Rows as wide as the columns libjpeg decodes (the window, a margin and the iMCU
            # rounding), so that it writes the pixels where they stay: the window is a view of them.
            out = np.empty((h, min(frame.width, w + _WINDOW_SLACK), 3), np.uint8)
            try:
                shift = _jpegwindow.decode_window(payload, out, top, left, w)
            except ValueError:  # libjpeg reads another size than the header walk: decided below
                shift = None
            if shift is not None:
                return out[:, shift : shift + w]
            rgb = decode_payload(payload, codec, height, width, path=path, sample=sample)
            if rgb.shape[:2] == (frame.height, frame.width):  # the window already asked for
                return rgb[top : top + h, left : left + w]
            return crop_window(rgb, window, path=path, sample=sample)
    rgb = decode_payload(payload, codec, height, width, path=path, sample=sample)
    return crop_window(rgb, window, path=path, sample=sample)


def _scaled_box(window: Window, scale: int) -> Window:
    """A full-size window's rectangle in the pixels of a 1/``scale`` decode, edges rounded outwards."""
    top, left, h, w = window
    t, x0 = top // scale, left // scale
    return t, x0, -(-(top + h) // scale) - t, -(-(left + w) // scale) - x0


def _scaled_window(payload: bytes | memoryview, height: int, width: int, window: Callable[[int, int], Window],
                   scale: int, path: str | None, sample: int | str | None,
                   frame: JpegFrame | None) -> np.ndarray:
    """:func:`decode_payload_window` at a reduced ``scale`` (``frame``: the payload's, or None)."""
    upright = frame is not None and not frame.oriented and frame.height > 0 and frame.width > 0
    if upright and window_decoding() and frame.marker in _WINDOW_FRAMES:
        t, x0, h, w = _scaled_box(_checked_window(window, frame.height, frame.width, path, sample), scale)
        out = np.empty((h, min(-(-frame.width // scale), w + _WINDOW_SLACK), 3), np.uint8)
        try:
            shift = _jpegwindow.decode_window(payload, out, t, x0, w, scale)
        except ValueError:
            shift = None
        if shift is not None:
            return out[:, shift : shift + w]
    rgb = None
    if upright and _simplejpeg is not None:
        sh, sw = -(-frame.height // scale), -(-frame.width // scale)
        try:  # the smallest of TurboJPEG's scales that keeps sh x sw: 1/scale (for images of 8 px or more)
            rgb = _simplejpeg.decode_jpeg(payload, colorspace="rgb", strict=True, min_height=sh, min_width=sw)
        except (ValueError, TypeError):
            rgb = None
        if rgb is not None and rgb.shape[:2] != (sh, sw):
            rgb = None
        if rgb is not None:
            full = frame.height, frame.width
    if rgb is None:
        whole = decode_payload(payload, "jpeg", height, width, path=path, sample=sample)
        full = whole.shape[:2]
        rgb = shrink_area(whole, -(-full[1] // scale), -(-full[0] // scale))
    t, x0, h, w = _scaled_box(_checked_window(window, full[0], full[1], path, sample), scale)
    return rgb[t : t + h, x0 : x0 + w]


def shrink_area(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)`` for a shrink
    (``width`` and ``height`` no larger than the image's), the same bytes, faster where packer's C
    module does it: an H x W x 3 uint8 image (rows may be strided, as a window's are) at a ratio
    that is not a whole number on both sides, which OpenCV computes by the general area average
    and the module by the same arithmetic in fewer passes (docs/benchmarks.md, section 14).
    Anything else (other channel counts or dtypes, whole-number ratios, no C module) is OpenCV's own."""
    h, w = pixels.shape[:2]
    if (_AREA is not None and pixels.ndim == 3 and pixels.shape[2] == 3 and pixels.dtype == np.uint8
            and 0 < width <= w < 1 << 24 and 0 < height <= h < 1 << 24 and (w % width or h % height)
            and pixels.strides[1:] == (3, 1) and pixels.strides[0] >= 3 * w):
        out = np.empty((height, width, 3), np.uint8)
        _AREA(pixels, out)
        return out
    return cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)


def crop_window(rgb: np.ndarray, window: Callable[[int, int], Window], *, path: str | None = None,
                sample: int | str | None = None) -> np.ndarray:
    """The view of decoded H x W x 3 pixels that ``window(H, W)`` picks (ValueError naming the
    sample where it does not fit)."""
    top, left, h, w = _checked_window(window, rgb.shape[0], rgb.shape[1], path, sample)
    return rgb[top : top + h, left : left + w]


def _checked_window(window: Callable[[int, int], Window], height: int, width: int, path: str | None,
                    sample: int | str | None) -> Window:
    try:
        got = window(height, width)
    except ValueError as e:
        raise ValueError(f"{_where(path, sample)}: {e}") from None
    try:  # NumPy integers count as ints (as Python ints: np.uint8 sums would wrap); floats and bools do not
        if len(got) != 4 or any(isinstance(v, (bool, np.bool_)) for v in got):
            raise TypeError
        top, left, h, w = (operator.index(v) for v in got)
    except TypeError:
        raise TypeError(f"{_where(path, sample)}: a crop window must be four integers (top, left, height, width), "
                        f"not {got!r}") from None
    if not (h > 0 and w > 0 and top >= 0 and left >= 0 and top + h <= height and left + w <= width):
        raise ValueError(f"{_where(path, sample)}: the {h}x{w} crop window at ({top}, {left}) does not fit the "
                         f"{height}x{width} image")
    return top, left, h, w


def _where(path: str | None, sample: int | str | None) -> str:
    return f"sample {sample} of {path}" if path is not None else f"sample {sample}"


def _turbo_decode(payload: bytes | memoryview) -> np.ndarray | None:
    """A JPEG payload decoded to RGB by libjpeg-turbo's TurboJPEG API, or None where OpenCV must
    decide.

    Both decoders are libjpeg-turbo with its defaults (accurate integer IDCT, smooth chroma
    upsampling), so the pixels are the same; TurboJPEG skips OpenCV's decoder probing and header
    re-reads (docs/benchmarks.md, section 7). OpenCV keeps the cases where the two differ: a
    payload whose EXIF orientation turns or flips the image (OpenCV applies it), one libjpeg warns
    about (damaged: OpenCV returns what it could decode), and what TurboJPEG cannot give as RGB
    (CMYK, 12-bit).
    """
    if _simplejpeg is None or jpeg_oriented(payload):
        return None
    try:
        return _simplejpeg.decode_jpeg(payload, colorspace="rgb", strict=True)
    except (ValueError, TypeError):
        return None
