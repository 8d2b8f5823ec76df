"""What a long job shows: a bar on a terminal, plain lines with count, rate and ETA elsewhere."""

from __future__ import annotations

import io
import re

import pytest

from packer.cli import main
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from packer.progress import Progress, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_format_duration():
    assert [format_duration(s) for s in (0, 5.4, 65, 3600 + 2 * 60 + 3, -1)] == ["0:00", "0:05", "1:05", "1:02:03", "0:00"]


def test_lines_come_every_interval_with_count_rate_and_eta():
    out, clock = io.StringIO(), FakeClock()
    p = Progress(100, desc="convert -> tar", mode="auto", interval=30, file=out, clock=clock)
    assert p.mode == "lines"  # not a terminal
    for _ in range(10):
        clock.now += 2
        p.update()
    assert out.getvalue() == ""  # 20 s: no line yet
    for _ in range(10):
        clock.now += 2
        p.update()
    assert out.getvalue().splitlines() == ["convert -> tar: 15/100 (15%) in 0:30, 0.5 img/s, ETA 2:50"]
    for _ in range(15):
        clock.now += 2
        p.update()
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1] == "convert -> tar: 30/100 (30%) in 1:00, 0.5 img/s, ETA 2:20"


def test_a_resumed_job_counts_its_kept_items_in_the_total_not_in_the_rate():
    out, clock = io.StringIO(), FakeClock()
    p = Progress(100, desc="d", initial=60, interval=10, file=out, clock=clock, mode="lines")
    clock.now += 10
    p.update(20)
    assert out.getvalue().strip() == "d: 80/100 (80%) in 0:10, 2.0 img/s, ETA 0:10"


def test_unknown_total_and_no_progress_yet():
    out, clock = io.StringIO(), FakeClock()
    p = Progress(None, desc="d", interval=1, file=out, clock=clock, mode="lines")
    clock.now += 1
    p.update(0)
    assert out.getvalue().strip() == "d: 0 in 0:01, 0.0 img/s"
    assert Progress(5, desc="d", file=out, clock=clock, mode="lines").line() == "d: 0/5 (0%) in 0:00, 0.0 img/s, ETA unknown"


def test_a_terminal_gets_a_bar_and_off_is_silent():
    tty = Terminal()
    with Progress(3, desc="convert -> lmdb", file=tty) as p:
        assert p.mode == "bar"
        p.update(3)
    assert "convert -> lmdb" in tty.getvalue() and "3/3" in tty.getvalue()
    quiet = io.StringIO()
    with Progress(3, desc="x", mode="off", interval=0, file=quiet) as p:
        p.update(3)
    assert quiet.getvalue() == ""
    with pytest.raises(ValueError, match="progress mode"):
        Progress(3, desc="x", mode="fancy")


LINE = re.compile(r"^convert -> (\w+): (\d+)/(\d+) \((\d+)%\) in \d+:\d\d, [\d.]+ img/s, ETA (\d+:\d\d|unknown)$")


def test_a_conversion_logs_lines_when_stderr_is_not_a_terminal(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    convert_imagefolder(src, str(tmp_path / "a"), "lmdb", ConvertOptions(progress=True, progress_interval=0.0))
    lines = capsys.readouterr().err.splitlines()
    counts = [int(m.group(2)) for m in map(LINE.match, lines) if m]
    assert counts == list(range(1, 15)) and len(lines) == 14  # interval 0: a line per image, nothing else
    convert_imagefolder(src, str(tmp_path / "b"), "lmdb", ConvertOptions(progress=False, progress_interval=0.0))
    assert capsys.readouterr().err == ""


def test_the_command_line_takes_the_interval_and_quiet(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    assert main(["convert", "imagefolder", "tar", src, str(tmp_path / "a"), "--workers", "1",
                 "--log-interval", "1e-9"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [LINE.match(e).group(2) for e in err if LINE.match(e)] == [str(i) for i in range(1, 15)]
    assert main(["convert", "imagefolder", "tar", src, str(tmp_path / "b"), "--workers", "1", "-q",
                 "--log-interval", "1e-9"]) == 0
    assert not any(LINE.match(e) for e in capsys.readouterr().err.splitlines())
    assert main(["convert", "imagefolder", "tar", src, str(tmp_path / "c"), "--log-interval", "0"]) == 2
    assert "--log-interval must be above 0" in capsys.readouterr().err
