"""The options layer and the source table: ``packer.convert`` and ``packer.pack`` build typed options
from keywords without argparse, errors name the keyword (the command line's the flag), and a source
is one row in the table (a toy one added here converts end to end, by keyword and by flag)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import packer
from packer.cli import main
from packer.conversion.options import OPTIONS, Caller, OptionError, SourceOptions
from packer.conversion.request import convert_request
from packer.datasets import open_dataset
from packer.sources.table import SOURCES, Source, add_source, get_source, source_names
from tests.helpers import tree

PROBE = """
import json, sys
import numpy as np
import packer

src, out = sys.argv[1], sys.argv[2]
report = packer.convert("imagefolder", "lmdb", src, out + "/convert", workers=1, quiet=True)
sample = {"image": np.zeros((4, 5, 3), np.uint8), "label": "a"}
packed = packer.pack([sample, sample], out + "/pack", "tar", workers=1, quiet=True)
loaded = sorted(n for n in sys.modules if n == "packer" or n.startswith("packer."))
print(json.dumps({"samples": [report.manifest.num_samples, packed.manifest.num_samples],
                  "files": {n: getattr(sys.modules[n], "__file__", None) for n in loaded}}))
"""


def _imports_argparse(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        module = ast.parse(f.read(), path)
    return any(isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names)
               or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse"
               for node in ast.walk(module))


def test_the_python_api_reaches_no_argparse(tiny_folder, tmp_path):
    """A real conversion and a real pack in a fresh process load no packer module that imports
    argparse (lazily included), and not the command line. (argparse itself may be in sys.modules:
    third-party packages such as crc32c import it for their own command lines.)"""
    src, _ = tiny_folder
    out = subprocess.run([sys.executable, "-c", PROBE, src, str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["samples"] == [14, 2]
    files = got["files"]
    assert not [n for n in files if n == "packer.cli" or n.startswith("packer.cli.")] and "packer.conversion.options" in files and "packer.sources.table" in files
    assert not [n for n, path in files.items() if path and path.endswith(".py") and _imports_argparse(path)]


def test_keyword_errors_name_the_keyword_and_flag_errors_the_flag(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    cases = [  # (keywords, flags, keyword message, flag message)
        ({"workers": 0}, ["--workers", "0"], "workers must be at least 1", "--workers must be at least 1"),
        ({"mask_column": "m"}, ["--mask-column", "m"], "mask_column applies to a list source only",
         "--mask-column applies to a list source only"),
        ({"resize": "big"}, ["--resize", "big"], "resize: bad resize policy 'big'", "--resize: bad resize policy 'big'"),
        ({"prefix": "x", "quiet": True}, ["--prefix", "x", "-q"], "prefix applies to tar and tfrecord output only",
         "--prefix applies to tar and tfrecord output only"),
    ]
    for keywords, flags, by_keyword, by_flag in cases:
        with pytest.raises(OptionError) as e:
            packer.convert("imagefolder", "lmdb", src, tmp_path / "k", **keywords)
        assert str(e.value).startswith(f"packer.convert(): {by_keyword}"), e.value
        assert main(["convert", "imagefolder", "lmdb", src, str(tmp_path / "f"), *flags]) == 2
        assert capsys.readouterr().err.startswith(f"packer convert: {by_flag}")
    with pytest.raises(OptionError, match=r"^packer\.convert\(\): a coco source needs images, the folder"):
        packer.convert("coco", "lmdb", src, tmp_path / "k")
    assert main(["convert", "coco", "lmdb", src, str(tmp_path / "f")]) == 2
    assert "packer convert: a coco source needs --images DIR, the folder of its images" in capsys.readouterr().err
    with pytest.raises(OptionError, match=r"^packer\.convert\(\): rank_timeout='soon' is not a positive number"):
        packer.convert("imagefolder", "lmdb", src, tmp_path / "k", rank_timeout="soon")
    assert convert_request(Caller("x()"), "imagefolder", "lmdb", src, "d", {"rank_timeout": 5}).rank_timeout == 5.0
    with pytest.raises(TypeError, match=r"^packer\.convert\(\): image_column takes a string or a list of strings"):
        packer.convert("list", "lmdb", src, tmp_path / "k", image_column=3)
    with pytest.raises(TypeError, match=r"packer\.pack\(\) got an unexpected keyword argument 'no_torchrun'"):
        packer.pack([], tmp_path / "k", "lmdb", no_torchrun=True)
    assert not os.path.exists(tmp_path / "k") and not os.path.exists(tmp_path / "f")


def test_the_table_is_the_one_list_of_options_and_sources():
    names = [o.name for o in OPTIONS]
    assert len(set(names)) == len(names)
    assert set(SourceOptions.__dataclass_fields__) <= set(names)
    for s in SOURCES.values():
        assert set(s.takes) <= set(SourceOptions.__dataclass_fields__), s.name
    assert source_names()[:3] == ["imagefolder", "list", "coco"]
    assert get_source("imagefolder").splits and not get_source("list").splits
    assert get_source("mds").reads_urls and get_source("lmdb").packed and not get_source("coco").packed
    with pytest.raises(KeyError, match="no source 'nothing'"):
        get_source("nothing")


def _toy(request):  # noqa: ANN001, ANN202 - a ConvertRequest, a ConvertReport
    """The toy source's converter: SRC is a text file of ``LABEL PATH`` lines (paths relative to it)."""
    from packer.pipeline.items import convert_items

    folder = os.path.dirname(os.path.abspath(request.src))
    with open(request.src, encoding="utf-8") as f:
        rows = [line.split(maxsplit=1) for line in f.read().splitlines() if line.strip()]
    items = [(os.path.join(folder, path), label, None) for label, path in rows]
    return convert_items(items, request.dst, request.dst_format, request.options, root=folder,
                         source={"kind": "toy", "rows": len(items),
                                 "deadline": os.environ.get("PACKER_REMOTE_DEADLINE")})


@pytest.fixture
def toy_source():
    add_source(Source("toy", _toy, takes=("label_column",)))
    try:
        yield
    finally:
        SOURCES.pop("toy")


def test_a_toy_source_is_one_row_and_converts_end_to_end(toy_source, tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    names = sorted(os.path.relpath(os.path.join(d, n), src) for d, _, ns in os.walk(src) for n in ns)
    listing = os.path.join(src, "toy.txt")
    with open(listing, "w", encoding="utf-8") as f:
        f.writelines(f"{n.split(os.sep)[0].replace(' ', '_')} {n}\n" for n in names)
    report = packer.convert("toy", "lmdb", listing, tmp_path / "api", workers=1, quiet=True, no_shuffle=True)
    assert report.manifest.num_samples == 14 and report.manifest.source["kind"] == "toy"
    assert main(["convert", "toy", "lmdb", listing, str(tmp_path / "cli"), "--workers", "1", "-q",
                 "--no-shuffle"]) == 0
    assert tree(tmp_path / "api") == tree(tmp_path / "cli")
    again = packer.convert("toy", "tar", listing, tmp_path / "deadline", workers=1, quiet=True, remote_deadline=7)
    assert again.manifest.source["deadline"] == "7.0" and "PACKER_REMOTE_DEADLINE" not in os.environ
    ds = open_dataset(tmp_path / "api", fields=("key", "label"), as_dict=True)
    assert [ds.classes[ds[i]["label"]] for i in range(len(ds))] == [n.split(os.sep)[0].replace(" ", "_")
                                                                    for n in names]
    with pytest.raises(OptionError, match=r"mask_column applies to a list source only"):
        packer.convert("toy", "lmdb", listing, tmp_path / "x", mask_column="m")
    with pytest.raises(OptionError, match=r"^packer\.convert\(\): toy -> imagefolder is not a conversion$"):
        packer.convert("toy", "imagefolder", listing, tmp_path / "x")
    assert main(["convert", "toy", "lmdb", listing, str(tmp_path / "y"), "--drop-column", "c"]) == 2
    assert "--drop-column applies to mds, litdata and parquet sources only" in capsys.readouterr().err
