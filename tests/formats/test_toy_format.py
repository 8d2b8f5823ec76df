"""Adding a format is one module and one row: the toy format of tests/toyformat.py (a writer, a
reader and an ``identify``) gets one record in the registry (``packer.formats.FORMATS``) and is
then converted to through ``packer.convert`` and the CLI, read with ``open_dataset``, listed in
the CLI's format choices and converted from, with the pixels and labels the LMDB path gives."""

from __future__ import annotations

import numpy as np
import pytest

import packer
from packer import formats
from packer.cli import main
from packer.datasets import open_dataset
from packer.formats import Format
from tests import toyformat


@pytest.fixture
def toy_format(monkeypatch):
    row = Format("toy", lambda: toyformat.ToyWriter, lambda: toyformat.ToyDataset, frozenset(),
                 identify=toyformat.identify)
    monkeypatch.setitem(formats.FORMATS, "toy", row)  # the one row (taken out again after the test)


def _samples(path) -> list[tuple[np.ndarray, int, str]]:
    with open_dataset(path, fields=("image", "label", "key"), output="numpy") as ds:
        return [tuple(ds[i]) for i in range(len(ds))]


def _same(a: list, b: list) -> None:
    assert len(a) == len(b) == 14
    for (image, label, key), (want_image, want_label, want_key) in zip(a, b):
        assert key == want_key and label == want_label and np.array_equal(image, want_image)


def test_a_toy_format_is_one_module_and_one_row(toy_format, tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    kw = {"workers": 1, "quiet": True, "no_shuffle": True}
    packer.convert("imagefolder", "lmdb", src, tmp_path / "lmdb", **kw)
    report = packer.convert("imagefolder", "toy", src, tmp_path / "toy", **kw)
    assert report.manifest.format == "toy" and report.manifest.num_samples == 14
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["data.toy", "manifest.json", "samples.table"]
    with open_dataset(tmp_path / "toy") as ds:
        assert type(ds) is toyformat.ToyDataset
    _same(_samples(tmp_path / "toy"), _samples(tmp_path / "lmdb"))
    # the command line takes its format choices from the table: toy as destination and as source
    assert main(["convert", "imagefolder", "toy", src, str(tmp_path / "cli"), "--workers", "1", "-q",
                 "--no-shuffle"]) == 0
    assert (tmp_path / "cli" / "data.toy").read_bytes() == (tmp_path / "toy" / "data.toy").read_bytes()
    assert main(["convert", "toy", "lmdb", str(tmp_path / "toy"), str(tmp_path / "back"), "-q"]) == 0
    _same(_samples(tmp_path / "back"), _samples(tmp_path / "lmdb"))
    assert main(["verify", str(tmp_path / "toy")]) == 0
    # a folder left by an interrupted toy conversion is told from other folders by its identify
    (tmp_path / "toy" / "manifest.json").unlink()
    assert formats.describe_directory(str(tmp_path / "toy")) is None


def test_without_its_row_the_format_is_unknown(tiny_folder, tmp_path, capsys):
    assert "toy" not in formats.format_names()
    assert main(["convert", "imagefolder", "toy", tiny_folder[0], str(tmp_path / "x")]) == 2
    assert "invalid choice: 'toy'" in capsys.readouterr().err
