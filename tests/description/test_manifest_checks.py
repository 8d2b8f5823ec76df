"""Manifests read as hostile input: file names outside the dataset, links and FIFOs, class lists,
sample counts, nesting and JSON types, file and class lists, each refused in one line naming the field."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.cli import main
from packer.description.registry import format_names
from tests.datasets.test_dataset_identity import _two_datasets
from tests.helpers import _src, pack, run_cli

FORMATS = format_names()


# -- only regular files inside the dataset are read -----------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_manifest_file_names_outside_the_dataset_are_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest, write_manifest

    dst, _ = _two_datasets(tmp_path, fmt)
    m = read_manifest(dst)
    name = m.files[0].name
    shutil.copyfile(os.path.join(dst, name), tmp_path / name)
    for bad in (f"../{name}", str(tmp_path / name), "", "..", "a\\b"):
        m.files[0].name = bad
        write_manifest(dst, m)
        r = run_cli("verify", dst)
        assert r.returncode == 1 and "not a plain file name" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_symlinked_payload_is_refused(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst, _ = _two_datasets(tmp_path, fmt)
    name = open_dataset(dst).manifest.files[0].name
    os.rename(os.path.join(dst, name), tmp_path / "moved")
    os.symlink(tmp_path / "moved", os.path.join(dst, name))
    with pytest.raises(CorruptDataError, match="regular file|symlink"):
        open_dataset(dst)[0]
    r = run_cli("verify", dst)
    assert r.returncode == 1 and "not a regular file" in r.stdout + r.stderr


@pytest.mark.parametrize("what", ["manifest", "index"])
def test_fifo_in_place_of_a_packed_file_does_not_hang(tmp_path, what):
    fmt = "tfrecord" if what == "index" else "lmdb"
    dst, _ = _two_datasets(tmp_path, fmt)
    name = "manifest.json" if what == "manifest" else "shard-000000.idx"
    if what == "index":
        assert name in os.listdir(dst)
    os.remove(os.path.join(dst, name))
    os.mkfifo(os.path.join(dst, name))
    for cmd in (["info", dst], ["verify", dst]) if what == "manifest" else (["verify", dst],):
        r = run_cli(*cmd)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "regular file" in out and "Traceback" not in out, out


@pytest.mark.parametrize("classes", [["a", "a"], "ab", {"a": 0}, [1, 2], None])
def test_malformed_class_lists_are_refused(tmp_path, classes):
    import json

    from packer.description.manifest import read_manifest
    from packer.errors import ManifestError

    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["classes"] = classes
    json.dump(d, open(path, "w"))
    with pytest.raises(ManifestError, match="classes|class"):
        read_manifest(dst)


@pytest.mark.parametrize("literal", ["-1", "1e400", "1" + "0" * 5000, '"12"', "true", str(2**63), "2.0"],
                         ids=["negative", "1e400", "5000-digits", "string", "bool", "2^63", "float"])
def test_malformed_sample_counts_are_refused(tmp_path, literal):
    import json

    dst, _ = _two_datasets(tmp_path, "lmdb")
    path = os.path.join(dst, "manifest.json")
    text = open(path).read()
    d = json.loads(text)
    d["num_samples"] = "__N__"
    open(path, "w").write(json.dumps(d).replace('"__N__"', literal))
    r = run_cli("info", dst)
    assert r.returncode == 1 and ("num_samples" in r.stderr or "digits" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_deeply_nested_manifest_is_refused(tmp_path):
    dst, _ = _two_datasets(tmp_path, "lmdb")
    open(os.path.join(dst, "manifest.json"), "w").write("[" * 100_000 + "]" * 100_000)
    r = run_cli("verify", dst)
    assert r.returncode == 1 and "nested too deeply" in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- manifests: every field of the wrong JSON type is one line naming the field --------------------
_NESTED = {
    "processing-string": (lambda d: d.__setitem__("processing", "x"), "processing"),
    "processing.encoding-int": (lambda d: d["processing"].__setitem__("encoding", 5), "processing.encoding"),
    "skipped-string": (lambda d: d.__setitem__("skipped", "x"), "skipped"),
    "skipped-ints": (lambda d: d.__setitem__("skipped", [1, 2]), "skipped[0]"),
    "skipped-path-int": (lambda d: d.__setitem__("skipped", [{"path": 1, "reason": "r"}]), "skipped[0].path"),
    "skipped-empty-object": (lambda d: d.__setitem__("skipped", [{}]), "skipped[0].path"),
    "files-strings": (lambda d: d.__setitem__("files", ["data"]), "files[0]"),
    "files-empty-object": (lambda d: d["files"].__setitem__(0, {}), "files[0].name"),
    "layout-list": (lambda d: d.__setitem__("layout", [1]), "layout"),
    "layout.foreign-string": (lambda d: d["layout"].__setitem__("foreign", "yes"), "layout.foreign"),
    "ignored-string": (lambda d: d.__setitem__("ignored", "x"), "ignored"),
    "ignored.hidden-string": (lambda d: d.__setitem__("ignored", {"hidden": "x"}), "ignored.hidden"),
    "shuffle_seed-string": (lambda d: d.__setitem__("shuffle_seed", "x"), "shuffle_seed"),
    "created_by-list": (lambda d: d.__setitem__("created_by", [1]), "created_by"),
    "unknown-format": (lambda d: d.__setitem__("format", "zarr"), "format 'zarr'"),
}


@pytest.mark.parametrize("case", list(_NESTED))
def test_nested_manifest_fields_of_the_wrong_type_are_one_line_naming_the_field(tmp_path, capsys, case):
    import json

    from packer.datasets import open_dataset
    from packer.errors import ManifestError

    mutate, field = _NESTED[case]
    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    mutate(d)
    json.dump(d, open(path, "w"))
    for cmd in ("info", "verify"):
        assert main([cmd, dst]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and field in err and "manifest.json" in err, err
    with pytest.raises(ManifestError, match=f"manifest.json: .*{field.replace('[', '.').replace(']', '.')}"):
        open_dataset(dst)


def test_manifest_strings_with_lone_surrogate_escapes_are_refused_naming_the_field(tmp_path, capsys):
    """JSON lets "caf\\udce9" stand alone; converting such a dataset failed with a raw
    UnicodeEncodeError. A valid pair (an emoji written as two escapes) is fine."""
    import json

    dst, _ = _two_datasets(tmp_path, "tar")
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["created_by"] = "packer \U0001f600"
    d["classes"][0] = "caf\udce9"
    open(path, "w").write(json.dumps(d))  # ASCII: the emoji as a surrogate pair, the other one alone
    for argv in (["info", dst], ["verify", dst], ["convert", "tar", "lmdb", dst, str(tmp_path / "o")]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "classes[0] holds a lone UTF-16 surrogate" in err, err
    d["classes"][0] = "x"
    open(path, "w").write(json.dumps(d))
    assert main(["info", dst]) == 0 and "\U0001f600" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_count_the_files_cannot_hold_is_refused_at_once(tmp_path, fmt):
    """num_samples of 10^15 (files[] forged to agree): verify used to loop for ever (LMDB, HDF5) or
    try to allocate petabytes (TFRecord)."""
    import json

    dst, _ = _two_datasets(tmp_path, fmt)
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    d["files"][0]["samples"] += 10**15 - d["num_samples"]
    d["num_samples"] = 10**15
    json.dump(d, open(path, "w"))
    for cmd in ("info", "verify"):
        r = run_cli(cmd, dst)
        assert r.returncode == 1 and "every sample takes at least one byte" in r.stderr, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_count_the_payload_does_not_hold_is_one_problem_in_verify(tmp_path, fmt):
    """num_samples forged to the payload file's byte count (the most the manifest allows): verify
    reported one problem per sample (LMDB) or reopened the file for each of 1.4 million (HDF5)."""
    import json

    dst, _ = _two_datasets(tmp_path, fmt)
    path = os.path.join(dst, "manifest.json")
    d = json.load(open(path))
    n = d["files"][0]["bytes"]
    d["files"][0]["samples"] += n - d["num_samples"]
    d["num_samples"] = n
    json.dump(d, open(path, "w"))
    r = run_cli("verify", dst)
    assert r.returncode == 1 and "cannot open" in r.stdout + r.stderr and "more problems" not in r.stdout, r.stdout


# -- manifests whose file list or class list cannot describe the data ------------------------------
def _forge(d, case):
    payload = [f for f in d["files"] if f["samples"]]
    if case == "first":
        payload[0]["first"] = 2
    elif case == "classes":
        d["classes"] = []
    else:
        d["files"], d["num_samples"] = [], 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_manifests_with_a_wrong_first_no_classes_or_no_files_are_one_line(tmp_path, fmt, capsys):
    """files[].first off was struct.error (TFRecord) naming no file; classes: [] and files: [] were
    accepted, files: [] read as empty and verify died with StopIteration."""
    import json

    from packer.datasets import open_dataset
    from packer.errors import ManifestError

    src = _src(tmp_path)
    for case, why in (("first", r"files\[0\] \('\S+'\) says its first sample is 2, but the files listed before it "
                                r"hold 0"),
                      ("classes", r"classes is empty, but the 6 samples have class labels"),
                      ("files", r"files\[\] lists no file holding samples")):
        dst = str(tmp_path / f"{fmt}-{case}")
        pack(src, dst, fmt)
        path = os.path.join(dst, "manifest.json")
        d = json.load(open(path))
        _forge(d, case)
        json.dump(d, open(path, "w"))
        with pytest.raises(ManifestError, match=why):
            open_dataset(dst)
        capsys.readouterr()
        for cmd in ("verify", "info"):
            assert main([cmd, dst]) == 1, (case, cmd)
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and path in err[0], (case, cmd, err)
