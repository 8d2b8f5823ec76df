"""A JPEG's structure read without decoding it: its frame header, its scans, whether it is truncated,
and the warnings libjpeg prints while it decodes (the image pipeline's checks on JPEGs)."""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

from ..errors import ImageError
from ..files.fileio import anonymous_file
from .imageheader import tiff_tags

__all__ = ["JpegFrame", "jpeg_frame", "jpeg_oriented", "jpeg_truncation", "refuse_truncated", "libjpeg_warnings"]


@dataclass(frozen=True)
class JpegFrame:
    """What a JPEG's header segments say, up to its first scan."""

    marker: int  # the frame's SOFn marker: 0xC0 baseline, 0xC2 progressive, 0xC9 arithmetic, ...
    height: int  # 0: given by a DNL marker after the first scan
    width: int
    components: tuple[int, ...]  # the component ids
    oriented: bool  # an EXIF orientation other than "as stored"
    first_scan: int  # offset of the first SOS marker


#: SOFn markers (0xC4 is DHT, 0xC8 reserved, 0xCC DAC); lossless frames have no DCT coefficients.
_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_LOSSLESS_FRAMES = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
_ARITHMETIC_FRAMES = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_ALL_COEFFICIENTS = (1 << 64) - 1


def jpeg_frame(payload: bytes | memoryview | np.ndarray) -> JpegFrame | None:
    """A walk over a JPEG's segment headers up to its first scan (about a microsecond for a
    stored payload without EXIF); None where the markers are too odd to tell or there is no frame."""
    p = memoryview(payload).cast("B")  # bytes-like or a uint8 array: indexing gives ints
    i, n = 2, len(p)
    frame: tuple[int, int, int, tuple[int, ...]] | None = None
    oriented = False
    while i + 4 <= n:
        if p[i] != 0xFF:
            return None
        marker = p[i + 1]
        if marker == 0xDA:  # start of scan: no more header segments
            if frame is None:
                return None
            return JpegFrame(*frame, oriented=oriented, first_scan=i)
        end = i + 2 + (p[i + 2] << 8 | p[i + 3])
        if marker in _FRAME_MARKERS and i + 10 <= n:
            count = p[i + 9]
            ids = tuple(p[i + 10 + 3 * k] for k in range(count) if i + 10 + 3 * k < min(n, end))
            frame = (marker, p[i + 5] << 8 | p[i + 6], p[i + 7] << 8 | p[i + 8], ids)
        elif marker == 0xE1 and p[i + 4 : i + 10] == b"Exif\0\0":
            turn = tiff_tags(bytes(p[i + 10 : end]), {0x0112}).get(0x0112, 1)
            oriented = oriented or 2 <= turn <= 8
        i = end
    return None


def jpeg_oriented(payload: bytes | memoryview | np.ndarray) -> bool:
    """Whether a JPEG payload has an EXIF orientation other than "as stored" before its scan, or
    markers too odd to tell."""
    frame = jpeg_frame(payload)
    return frame is None or frame.oriented


# -- truncated JPEGs --------------------------------------------------------------------------------
# One rule for every JPEG: its scans must reach their end. libjpeg finds a Huffman-coded scan that
# ends early (it warns), but not three other cases, checked here before the decode: no
# end-of-image marker after the last scan; a progressive JPEG cut between two scans (with an end
# marker appended), whose coefficients then never reach full precision; and an arithmetic-coded
# scan that ends early, which libjpeg decodes as if the missing data were zeros (the coding allows
# a few: the encoder drops its final zero bytes). For that last case, each first scan is decoded
# again with zero bytes placed after its data: libjpeg warns about the ones it did not need, so
# the count it used tells how far the scan's data falls short.

#: Zero bytes placed after an arithmetic-coded scan's data, and how many of them a complete first
#: scan of its coefficients may use. Measured on libjpeg-turbo's arithmetic-coded JPEGs of
#: 16-3000 px, flat, blurred and busy: complete first scans used at most 19; cut ones nearly
#: always all 256. Refinement scans (one more bit of coefficients already sent) are not checked:
#: over a flat area a complete one can use all 256, so a cut one cannot be told from it (what it
#: misses is the low bits of some coefficients).
_ARITHMETIC_PROBE = 256
_ARITHMETIC_SLACK = 48
_NO_END = "truncated JPEG (no end-of-image marker after the last scan)"
_EXTRANEOUS = re.compile(r"(\d+) extraneous bytes before marker")


@dataclass(frozen=True)
class _Scan:
    """One scan of a JPEG: where its entropy-coded data ends, and what it codes."""

    end: int  # offset of the marker after its data
    components: tuple[int, ...]
    first: int  # Ss: first coefficient
    last: int  # Se: last coefficient
    high: int  # Ah: the precision already sent (0: a first scan)
    low: int  # Al: the precision this scan leaves (0: full)


def jpeg_truncation(data: bytes) -> str | None:
    """Why a JPEG file is truncated (its scans end before their data does), or None where it is
    whole; the reason is worded for a skip. Arithmetic-coded files are decoded once per first scan
    for this (at 1/8 scale, in gray); others are only walked (tens of microseconds)."""
    frame = jpeg_frame(data)
    if frame is None:  # markers too odd to walk: the end marker is all that is checked
        if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
            return _NO_END
        return None
    scans, ended = _jpeg_scans(data, frame.first_scan)
    if not ended:
        return _NO_END
    if frame.marker not in _LOSSLESS_FRAMES:
        # each component's coefficients at full precision, one bit each (a sequential scan
        # codes all 64 of its components')
        progressive = frame.marker in _PROGRESSIVE_FRAMES
        complete = dict.fromkeys(frame.components, 0)
        for scan in scans:
            if scan.low == 0 or not progressive:
                bits = (1 << (scan.last + 1)) - (1 << scan.first) if progressive else _ALL_COEFFICIENTS
                for c in scan.components:
                    if c in complete:
                        complete[c] |= bits
        if any(bits & _ALL_COEFFICIENTS != _ALL_COEFFICIENTS for bits in complete.values()):
            return (f"truncated JPEG (cut between two scans: after scan {len(scans)}, some coefficients "
                    f"never reach full precision)")
    if frame.marker in _ARITHMETIC_FRAMES:
        for number, scan in enumerate(scans, 1):
            used = 0 if scan.high else _zeros_used(data, scan.end)
            if used > _ARITHMETIC_SLACK:
                return (f"truncated JPEG (arithmetic-coded scan {number} of {len(scans)} is "
                        f"{'at least ' if used >= _ARITHMETIC_PROBE else ''}{used} bytes short)")
    return None


def refuse_truncated(data: bytes, keep_damaged_jpeg: bool) -> None:
    """ImageError for a truncated JPEG; with ``keep_damaged_jpeg`` only for one without an end
    marker after its last scan (which no decoder here decodes)."""
    if keep_damaged_jpeg:
        reason = _NO_END if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda") else None
    else:
        reason = jpeg_truncation(data)
    if reason is not None:
        raise ImageError(reason if reason == _NO_END else f"{reason} (--keep-damaged-jpeg keeps such files)")


def _jpeg_scans(data: bytes, at: int) -> tuple[list[_Scan], bool]:
    """The scans of a JPEG from its first SOS marker at ``at``, and whether an end-of-image marker
    follows the last."""
    marks = _marker_offsets(data, at)
    scans: list[_Scan] = []
    i, n = at, len(data)
    while i + 2 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xD9:
            return scans, True
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if i + 4 > n:
            break
        end = i + 2 + (data[i + 2] << 8 | data[i + 3])
        if marker != 0xDA:
            i = end
            continue
        k = bisect.bisect_left(marks, end)  # the scan's data runs to the next marker
        stop = marks[k] if k < len(marks) else n
        while stop > end and data[stop - 1] == 0xFF:  # its fill bytes belong to the marker
            stop -= 1
        scan = _scan_header(data, i, stop)
        if scan is None:
            break
        scans.append(scan)
        i = stop
    return scans, False


def _marker_offsets(data: bytes, start: int) -> list[int]:
    """Where 0xFF is followed by a marker code from ``start`` on: not by 0x00 (a data byte), an
    RSTn (part of the data) or 0xFF (a fill byte). One pass in NumPy: far faster than a walk
    over the data's 0xFF bytes in Python."""
    b = np.frombuffer(data, np.uint8)[start:]
    code = b[1:]
    marks = (b[:-1] == 0xFF) & (code != 0) & (code != 0xFF) & ((code < 0xD0) | (code > 0xD7))
    return (np.flatnonzero(marks) + start).tolist()


def _scan_header(data: bytes, at: int, end: int) -> _Scan | None:
    """The scan whose SOS marker is at ``at`` and whose data ends at ``end``; None if cut short."""
    count = data[at + 4] if at + 4 < len(data) else 0
    tail = data[at + 5 + 2 * count : at + 8 + 2 * count]
    if len(tail) < 3:
        return None
    return _Scan(end, tuple(data[at + 5 : at + 5 + 2 * count : 2]), tail[0], tail[1], tail[2] >> 4, tail[2] & 15)


def _zeros_used(data: bytes, end: int) -> int:
    """How many zero bytes placed after the scan data ending at ``end`` libjpeg reads while
    decoding it (all of :data:`_ARITHMETIC_PROBE` where it reads at least that many)."""
    probe = b"".join((data[:end], bytes(_ARITHMETIC_PROBE), data[end:]))
    with libjpeg_warnings() as warnings:  # the entropy decode is all that is needed: 1/8 scale, gray
        cv2.imdecode(np.frombuffer(probe, np.uint8), cv2.IMREAD_REDUCED_GRAYSCALE_8)
    for warning in warnings:
        m = _EXTRANEOUS.search(warning)
        if m:
            return max(0, _ARITHMETIC_PROBE - int(m.group(1)))
    return _ARITHMETIC_PROBE


# -- libjpeg's warnings ------------------------------------------------------------------------------
# libjpeg decodes a damaged JPEG (truncated with an end marker appended, garbled scan data) with a
# *warning*, filling what is missing with grey or repeated blocks, and OpenCV returns that image as
# if nothing happened. libjpeg prints its first warning per decode on the C-level stderr, so the
# decode runs with descriptor 2 pointed at a private file for its duration (a few system calls,
# microseconds; a second decoder doing a strict pass would cost ~16% of a conversion's processing).
# What is printed meanwhile by anything else is passed on to the real stderr.
_LIBJPEG_WARNING = re.compile(
    rb"^(Corrupt JPEG data.*|Premature end of JPEG file|Invalid .*|Inconsistent progression sequence.*|"
    rb"Warning: .*|Unsupported marker type.*|Bogus .*)$"
)
_capture: tuple[int, int] | None = None  # (pid, descriptor of the capture file)


def _capture_fd() -> int:
    global _capture
    if _capture is None or _capture[0] != os.getpid():
        _capture = (os.getpid(), anonymous_file("packer-libjpeg"))
    return _capture[1]


@contextlib.contextmanager
def libjpeg_warnings() -> Iterator[list[str]]:
    """Collect the warnings libjpeg prints while the block decodes (the list is filled on exit)."""
    found: list[str] = []
    cap = _capture_fd()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    os.ftruncate(cap, 0)
    os.lseek(cap, 0, os.SEEK_SET)
    os.dup2(cap, 2)
    try:
        yield found
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        size = os.fstat(cap).st_size
        if size:
            other = []
            for line in os.pread(cap, min(size, 1 << 16), 0).splitlines():
                if _LIBJPEG_WARNING.match(line.strip()):
                    found.append(line.strip().decode("ascii", "replace"))
                elif line.strip():
                    other.append(line + b"\n")
            if other:
                os.write(2, b"".join(other))
