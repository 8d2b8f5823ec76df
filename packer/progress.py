"""What a long job shows while it runs: a tqdm bar on a terminal; elsewhere (nohup, SLURM, CI logs)
a plain line every ``interval`` seconds with the count, the rate and the time left."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["Progress", "format_duration", "LOG_INTERVAL"]

#: Seconds between two plain progress lines when stderr is not a terminal.
LOG_INTERVAL = 30.0


def format_duration(seconds: float) -> str:
    """``seconds`` as ``M:SS`` or ``H:MM:SS`` (``1:05``, ``2:03:04``)."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Count finished items and show it: ``mode`` is ``"bar"`` (tqdm), ``"lines"`` (a plain line
    at most every ``interval`` seconds), ``"off"``, or ``"auto"``: a bar when ``file`` (default
    stderr) is a terminal, else lines. ``initial`` items were done before (a resumed job): they
    count towards the total but not towards the rate. ``clock`` is injectable for tests.

    A line reads ``convert -> lmdb: 1200/5000 (24%) in 0:30, 40.0 img/s, ETA 1:35``.
    """

    def __init__(self, total: int | None, *, desc: str, initial: int = 0, unit: str = "img",
                 mode: str = "auto", interval: float = LOG_INTERVAL, file: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in ("auto", "bar", "lines", "off"):
            raise ValueError(f"progress mode {mode!r}: use auto, bar, lines or off")
        self.file = file if file is not None else sys.stderr
        if mode == "auto":
            isatty = getattr(self.file, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "lines"
        self.mode, self.total, self.desc, self.unit = mode, total, desc, unit
        self.initial = self.count = initial
        self.interval, self.clock = interval, clock
        self.start = self.last = clock()
        self.bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit=unit, file=self.file, dynamic_ncols=True, desc=desc)

    def update(self, n: int = 1) -> None:
        """``n`` more items are done."""
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.mode == "lines":
            now = self.clock()
            if now - self.last >= self.interval:
                self.last = now
                print(self.line(now), file=self.file, flush=True)

    def line(self, now: float | None = None) -> str:
        """The plain progress line as of ``now`` (default: the clock)."""
        elapsed = (self.clock() if now is None else now) - self.start
        done = self.count - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        if self.total:
            count = f"{self.count}/{self.total} ({100 * self.count / self.total:.0f}%)"
            eta = f"ETA {format_duration((self.total - self.count) / rate)}" if rate > 0 else "ETA unknown"
        else:
            count, eta = str(self.count), ""
        return f"{self.desc}: {count} in {format_duration(elapsed)}, {rate:.1f} {self.unit}/s" + (f", {eta}" if eta else "")

    def close(self) -> None:
        """Stop drawing (a bar is left as it last was)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
