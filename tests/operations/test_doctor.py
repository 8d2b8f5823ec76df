"""``packer doctor``: what this machine gives packer, found out in the reporting process."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from packer.cli import main
from packer.datasets import collation
from packer.images import imageproc
from packer.operations.doctor import collect, format_report
from tests.helpers import ROOT


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
    assert info["area_resize"] is (imageproc._AREA is not None)
    assert info["jpeg_decoder"] == ("turbojpeg" if imageproc._simplejpeg is not None else "opencv")
    assert info["usable_cpus"] >= 1
    assert set(info["extras"]) == set(_declared_extras())
    for name, missing in info["extras_missing"].items():
        assert missing and info["extras"][name] is False


def _declared_extras() -> dict[str, list[str]]:
    """setup.cfg's extras: name -> the distribution names it lists, read from the file itself."""
    import configparser
    import os
    import re

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    return {name: [re.match(r"[A-Za-z0-9._-]+", line.strip()).group(0)
                   for line in value.splitlines() if line.strip()]
            for name, value in cfg["options.extras_require"].items()}


def test_every_extra_is_listed_with_what_it_lacks():
    """Every extra of setup.cfg, each with exactly the distributions of it that are not installed
    (the extras of a requirement, as dask[distributed], followed), found from the installed metadata."""
    import importlib.metadata

    from packer.operations.doctor import extras_report

    def installed(dist: str) -> bool:
        try:
            importlib.metadata.version(dist)
            return True
        except importlib.metadata.PackageNotFoundError:
            return False

    report = extras_report()
    declared = _declared_extras()
    assert set(report) == set(declared) and {"mds", "parquet", "vision", "s3"} <= set(report)
    for name, dists in declared.items():
        expected = [d for d in dists if not installed(d)]
        assert [m for m in report[name] if m in dists] == expected, name
    # a nested extra is followed: dask[distributed] needs distributed as well as dask
    if installed("dask"):
        assert ("distributed" in report["dask"]) is (not installed("distributed"))
    text = format_report(collect())
    for name, missing in report.items():
        if missing:
            assert f"[{name}] needs {', '.join(missing)}" in " ".join(text.split())


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
    info.update(area_resize=True)
    assert "shrinking     packer's C module" in format_report(info)
    info.update(area_resize=False)
    assert "shrinking     OpenCV's INTER_AREA (the C module is not built)" in format_report(info)
    assert "simplejpeg is not importable" in text
