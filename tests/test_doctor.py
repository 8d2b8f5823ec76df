"""``packer doctor``: what this machine gives packer, found out in the reporting process."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from packer.datasets import collation
from packer.images import imageproc
from packer.ops.cli import main
from packer.ops.doctor import collect, format_report


def test_json_report_in_a_fresh_process_says_what_is_on():
    out = subprocess.run([sys.executable, "-m", "packer", "doctor", "--json"], capture_output=True, text=True,
                         check=True, timeout=120)
    info = json.loads(out.stdout)
    assert out.stderr == ""
    assert info["torch"] == torch.__version__
    assert isinstance(info["packer"], str) and info["packer"]
    # the self-test ran in that process and agrees with this one's
    assert info["collate_slots"] is collation.slots_available()[0]
    assert info["window_decode"] is imageproc.window_decoding()
    assert info["jpeg_decoder"] == ("turbojpeg" if imageproc._simplejpeg is not None else "opencv")
    assert info["usable_cpus"] >= 1
    assert set(info["extras"]) == {"s3", "gcs", "http"}


def test_text_report_is_one_screen(capsys):
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert 8 <= len(lines) <= 24 and all(len(line) <= 160 for line in lines)
    assert any(line.startswith("collate ") for line in lines)


def test_slots_off_are_reported_with_the_reason(monkeypatch):
    info = collect()
    info.update(collate_slots=False, collate_slots_off_because="multiprocessing's pickler did not use it")
    text = format_report(info)
    assert "OFF (multiprocessing's pickler did not use it): collate is default_collate" in text
    info.update(window_decode=False, jpeg_decoder="opencv")
    text = format_report(info)
    assert "not built: readers with crop= decode whole images" in text
    assert "simplejpeg is not importable" in text
