"""Integrity binds content to its place: payload files, shards, LMDB records, sample tables and
merged parts of another conversion or place are refused."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.cli import main
from packer.description.registry import format_names
from tests.helpers import make_folder, pack, run_cli

FORMATS = format_names()


# -- integrity binds content to its place -----------------------------------------------------------
def _raw_pair(tmp_path, fmt, **kw):
    """Two conversions of different pixels with the same names and sizes (raw: equal file sizes)."""
    outs = []
    for seed in (1, 2):
        src = str(tmp_path / f"s{seed}")
        make_folder(src, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]},
                    seed=seed)
        outs.append(str(tmp_path / f"o{seed}"))
        pack(src, outs[-1], fmt, encode="raw", shuffle=False, **kw)
    return outs


def _read_all(path):
    from packer.datasets import open_dataset

    ds = open_dataset(path)
    for i in range(len(ds)):
        ds[i]


@pytest.mark.parametrize("fmt", FORMATS)
def test_payload_file_of_equal_size_from_another_conversion_is_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError

    a, b = _raw_pair(tmp_path, fmt)
    for f in read_manifest(a).files:  # every file of b, under a's names: sizes all agree
        assert os.path.getsize(os.path.join(a, f.name)) == os.path.getsize(os.path.join(b, f.name))
        shutil.copyfile(os.path.join(b, f.name), os.path.join(a, f.name))
    with pytest.raises(CorruptDataError, match="another place|another file"):
        _read_all(a)


@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_shards_of_equal_size_swapped_on_disk_are_refused(tmp_path, fmt):
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError

    a, _ = _raw_pair(tmp_path, fmt, writer={"shard_samples": 6})
    m = read_manifest(a)
    pairs = {}
    for f in m.files:
        if f.name.startswith("shard-"):
            stem, ext = f.name.split(".", 1)
            pairs.setdefault(ext, []).append(f.name)
    for names in pairs.values():  # swap shard 0 and 1 with their index files, as a careless copy would
        x, y = (os.path.join(a, n) for n in names[:2])
        assert os.path.getsize(x) == os.path.getsize(y)
        os.rename(x, x + ".tmp")
        os.rename(y, x)
        os.rename(x + ".tmp", y)
    with pytest.raises(CorruptDataError, match="another place|first sample|index"):
        _read_all(a)


def test_lmdb_record_reached_through_a_wrong_pointer_is_refused(tmp_path):
    """What a flipped B-tree or overflow page number does: key i leads to sample j's intact record."""
    import lmdb

    from packer.errors import CorruptDataError

    a, _ = _raw_pair(tmp_path, "lmdb")
    env = lmdb.open(a, subdir=True, lock=False)
    with env.begin(write=True) as txn:
        other = txn.get(b"%010d" % 7)
        txn.put(b"%010d" % 3, other)
    env.close()
    from tests.helpers import forge_manifest_sizes

    forge_manifest_sizes(a)
    from packer.datasets import open_dataset

    ds = open_dataset(a)
    ds[2]
    with pytest.raises(CorruptDataError, match="another place.*sample 3"):
        ds[3]


def _table_pair(tmp_path, fmt):
    """Two conversions of one folder shuffled with different seeds: files of equal size (raw
    pixels), sample tables holding the same keys and labels in other orders."""
    src = str(tmp_path / "src")
    make_folder(src, {c: [(f"{c}{i}.png", 8, 8) for i in range(8)] for c in "abc"})
    outs = [str(tmp_path / f"o{seed}") for seed in (1, 2)]
    for seed, out in zip((1, 2), outs):
        pack(src, out, fmt, encode="raw", seed=seed)
    return outs


def _swap_table(tmp_path, fmt, how):
    """Dataset ``a`` with a sample table that is not its own (same size), and ``a``'s true
    labels and keys: ``foreign`` copies another conversion's table in; ``altered`` writes the
    table again with two labels changed and every checksum recomputed."""
    from packer.datasets import open_dataset
    from packer.description.samples import TABLE_NAME, build_table

    a, b = _table_pair(tmp_path, fmt)
    with open_dataset(a) as ds:
        truth = (list(ds.targets), list(ds.keys))
    table = os.path.join(a, TABLE_NAME)
    if how == "foreign":
        shutil.copyfile(os.path.join(b, TABLE_NAME), table)
    else:
        labels, keys = truth
        build_table(table, "class", iter([(k, (lab + 1) % 3 if i < 2 else lab)
                                          for i, (k, lab) in enumerate(zip(keys, labels))]))
    assert os.path.getsize(table) == os.path.getsize(os.path.join(b, TABLE_NAME))
    return a, truth


@pytest.mark.parametrize("how", ["foreign", "altered"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_table_that_is_not_the_datasets_own_is_refused(tmp_path, fmt, how):
    """Labels and keys come from the sample table: one from another conversion (or rewritten with
    valid checksums) is refused by every reader and by verify, one line naming the file; before,
    every format read it, ds.targets and ds.keys wrong."""
    from packer.datasets import StreamingDataset, open_dataset
    from packer.errors import CorruptDataError
    from packer.operations.verify import verify_dataset

    a, truth = _swap_table(tmp_path, fmt, how)
    table = os.path.join(a, "samples.table")
    reads = {
        "targets": lambda: open_dataset(a).targets,
        "keys": lambda: open_dataset(a).keys,
        "key field": lambda: open_dataset(a, fields=("image", "key"))[0],
        "streaming": lambda: list(StreamingDataset(a, shuffle=False, fields=("label", "key"))),
    }
    for what, read in reads.items():
        with pytest.raises(CorruptDataError, match="not this dataset's") as e:
            read()
        assert table in str(e.value) and "\n" not in str(e.value), what
    with open_dataset(a) as ds:  # labels from the payload files are right and still read
        assert [ds[i][1] for i in range(len(ds))] == truth[0]
    rep = verify_dataset(a)
    assert not rep.ok and any(table in p and "not this dataset's" in p for p in rep.problems), rep.problems
    r = run_cli("verify", a)
    assert r.returncode == 1 and "samples.table" in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["", "XYZ", "0123456789ABCDEF", 7])
def test_a_sample_table_id_that_is_not_one_is_refused_with_the_manifest(tmp_path, capsys, bad):
    """The table's id is 16 lowercase hex digits; a manifest holding anything else is one line
    naming the table or the field. Without one (as written before tables had an id) it opens."""
    import json

    a, _ = _table_pair(tmp_path, "tar")
    with open(os.path.join(a, "manifest.json")) as f:
        m = json.load(f)
    assert len(m["files"][-1]["id"]) == 16 and m["files"][-1]["name"] == "samples.table"
    m["files"][-1]["id"] = bad
    with open(os.path.join(a, "manifest.json"), "w") as f:
        json.dump(m, f)
    rc = main(["info", a])
    err = capsys.readouterr().err.strip().splitlines()
    if bad == "":  # as written before tables had an id: opens, the table checked by its SHA-256
        assert rc == 0
        from packer.datasets import open_dataset

        assert len(open_dataset(a).keys) == 24
    else:
        assert rc == 1 and len(err) == 1 and ("'samples.table' has no valid id" in err[0] or "files[2].id" in err[0])


@pytest.mark.parametrize(("fmt", "which"), [(f, "table") for f in FORMATS] + [(f, "payload") for f in FORMATS]
                         + [("tar", "index")])
def test_merge_refuses_a_part_file_from_another_conversion_before_copying(tmp_path, capsys, fmt, which):
    """merge checks each part's sample table and index files by SHA-256, its payload files by size
    and identity, before anything is copied: another conversion's file of the same size is refused
    naming the part and the file (before, a swapped table's keys were merged into a dataset that
    verified)."""
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError
    from packer.operations.merge import merge

    a, b = _table_pair(tmp_path, fmt)
    files = read_manifest(a).files
    name = {"table": files[-1].name, "payload": files[0].name, "index": files[1].name}[which]
    with open(os.path.join(a, name), "rb") as f, open(os.path.join(b, name), "rb") as g:
        ours, theirs = f.read(), g.read()
    assert ours != theirs and len(ours) == len(theirs)
    with open(os.path.join(a, name), "wb") as f:
        f.write(theirs)
    m = str(tmp_path / "m")
    with pytest.raises(CorruptDataError, match=f"part {a}: {name} differs from its manifest entry"):
        merge([b, a], m)
    assert not os.path.exists(m) and not os.path.exists(os.path.join(tmp_path, ".m.packer-tmp"))
    assert main(["merge", m, b, a]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"part {a}: {name}" in err[0] and "Traceback" not in err[0], err
