"""Read an image's format, size and EXIF orientation from its first bytes, without decoding it.

This is how the pixel limit is enforced *before* a decoder allocates anything (a 50,000 x 50,000
PNG is a few kB on disk and 7.5 GB decoded), and how ``keep`` decides whether original bytes can
be stored unchanged. Only headers are parsed; anything unrecognised returns ``None`` and the
decoder gets the last word.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["ImageInfo", "sniff", "describe_non_image", "tiff_tags"]


@dataclass(frozen=True)
class ImageInfo:
    """What the header says. ``channels``/``bit_depth`` are None where the header does not say."""

    format: str  # "jpeg", "png", "gif", "bmp", "webp", "tiff", "pnm"
    width: int
    height: int
    orientation: int = 1  # EXIF orientation, 1 = as stored
    channels: int | None = None
    bit_depth: int | None = None

    @property
    def pixels(self) -> int:
        """Width times height."""
        return self.width * self.height


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def tiff_tags(buf: bytes, wanted: set[int]) -> dict[int, int]:
    """Return the integer values of ``wanted`` tags in IFD0 of a TIFF structure (also EXIF)."""
    if len(buf) < 8 or buf[:2] not in (b"II", b"MM"):
        return {}
    end = "<" if buf[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(end + "I", buf, 4)
    if ifd + 2 > len(buf):
        return {}
    (count,) = struct.unpack_from(end + "H", buf, ifd)
    found: dict[int, int] = {}
    for k in range(min(count, 512)):
        pos = ifd + 2 + 12 * k
        if pos + 12 > len(buf):
            break
        tag, typ = struct.unpack_from(end + "HH", buf, pos)
        if tag not in wanted:
            continue
        if typ == 3:  # SHORT
            (found[tag],) = struct.unpack_from(end + "H", buf, pos + 8)
        elif typ == 4:  # LONG
            (found[tag],) = struct.unpack_from(end + "I", buf, pos + 8)
    return found


def _jpeg(data: bytes) -> ImageInfo | None:
    pos, n = 2, len(data)
    orientation = 1
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        seg = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            orientation = tiff_tags(seg[6:], {0x0112}).get(0x0112, 1)
        elif marker in _SOF and len(seg) >= 6:
            depth, h, w, comps = struct.unpack_from(">BHHB", seg, 0)
            return ImageInfo("jpeg", w, h, orientation if 1 <= orientation <= 8 else 1, comps, depth)
        elif marker == 0xDA:  # start of scan before any frame header
            return None
        pos += 2 + length
    return None


def _pnm(data: bytes) -> ImageInfo | None:
    tokens: list[bytes] = []
    for line in data[2:512].splitlines():
        tokens.extend(line.split(b"#", 1)[0].split())
        if len(tokens) >= 2:
            break
    try:
        w, h = int(tokens[0]), int(tokens[1])
    except (IndexError, ValueError):
        return None
    return ImageInfo("pnm", w, h, channels=3 if data[1:2] in (b"3", b"6") else 1)


def sniff(data: bytes) -> ImageInfo | None:
    """Return the header facts of encoded image bytes, or None when the format is not recognised."""
    try:
        if data[:3] == b"\xff\xd8\xff":
            return _jpeg(data)
        if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
            w, h, depth, ctype = struct.unpack_from(">IIBB", data, 16)
            channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(ctype)
            return ImageInfo("png", w, h, 1, channels, depth)
        if data[:6] in (b"GIF87a", b"GIF89a"):
            w, h = struct.unpack_from("<HH", data, 6)
            return ImageInfo("gif", w, h)
        if data[:2] == b"BM" and len(data) >= 26:
            w, h = struct.unpack_from("<ii", data, 18)
            return ImageInfo("bmp", abs(w), abs(h))
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            chunk = data[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack_from("<HH", data, 26)
                return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF)
            if chunk == b"VP8L":
                (bits,) = struct.unpack_from("<I", data, 21)
                return ImageInfo("webp", 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF))
            if chunk == b"VP8X":
                w = int.from_bytes(data[24:27], "little") + 1
                h = int.from_bytes(data[27:30], "little") + 1
                return ImageInfo("webp", w, h)
            return None
        if data[:4] in (b"II*\x00", b"MM\x00*"):
            tags = tiff_tags(data, {256, 257, 274})
            if 256 in tags and 257 in tags:
                return ImageInfo("tiff", tags[256], tags[257], tags.get(274, 1))
            return None
        if data[:1] == b"P" and data[1:2] in b"123456" and len(data) > 2:
            return _pnm(data)
    except struct.error:
        return None
    return None


def describe_non_image(data: bytes) -> str:
    """A short human description of bytes that are not an image, for error messages."""
    if not data:
        return "empty file (0 bytes)"
    head = data[:64].lstrip().lower()
    if head.startswith(b"version https://git-lfs"):
        return "a git-LFS pointer file, not the data (run `git lfs pull`)"
    if head.startswith((b"<!doctype html", b"<html", b"<?xml")):
        return "an HTML/XML page (a failed download?), not an image"
    # Never the bytes themselves: a reason is stored in the manifest, and the file may be a symlink
    # to anything readable (a key, a password file).
    return "not a recognised image format (no JPEG, PNG, GIF, WebP, BMP, TIFF or PNM signature)"
