"""Shard URLs and brace patterns in object storage: other tools' shards (webdataset's ShardWriter)
and packer's own on a real S3 server (moto's, on 127.0.0.1), read through s3fs and the node cache."""

from __future__ import annotations

import os

import pytest
from torch.utils.data import DataLoader

from packer.cli import main
from packer.datasets import ShardSpecError, StreamingDataset, open_dataset
from tests.datasets.test_shard_lists import _records, _write_wds
from tests.helpers import import_optional, pack
from tests.storage.test_remote import _remote, s3  # noqa: F401 - the moto server fixture

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")


def _put(s3, local, prefix):  # noqa: F811 - s3 is the fixture's value
    fs, path = _remote(f"s3://data/{prefix}", s3).filesystem()
    for name in sorted(os.listdir(local)):
        fs.put_file(os.path.join(local, name), f"{path}/{name}")
    return f"s3://data/{prefix}"


def _cli_options(s3, cache):  # noqa: F811
    """The command line's way to reach the moto server and use the node cache ``cache``."""
    return ["--storage-option", "key=testing", "--storage-option", "secret=testing",
            "--storage-option", f"client_kwargs.endpoint_url={s3['client_kwargs']['endpoint_url']}",
            "--storage-option", "client_kwargs.region_name=us-east-1", "--cache-dir", cache]


def test_webdataset_shards_in_s3_from_a_pattern_and_a_list(s3, tmp_path):  # noqa: F811
    written = _write_wds(str(tmp_path / "wds"))
    url = _put(s3, str(tmp_path / "wds"), "wds")
    pattern = f"{url}/shard-{{000000..000002}}.tar"
    cache = str(tmp_path / "cache")
    ds = open_dataset(pattern, storage_options=s3, cache_dir=cache)
    assert ds.url == url and len(ds) == 11 and _records(ds) == written
    listed = open_dataset([f"{url}/shard-{i:06d}.tar" for i in (1, 2)], storage_options=s3, cache_dir=cache)
    assert len(listed) == 7
    stream = StreamingDataset(pattern, storage_options=s3, cache_dir=cache, fields=("key", "label"), seed=2)
    seen = [kv for keys, labels in DataLoader(stream, batch_size=3, num_workers=2)
            for kv in zip(keys, labels.tolist())]
    assert sorted(seen) == sorted((k, lab) for k, (_, lab) in written.items())
    with pytest.raises(ShardSpecError, match=r"scans every one, so all 3 \(.* bytes\) must fit in cache_limit"):
        open_dataset(pattern, storage_options=s3, cache_dir=str(tmp_path / "small"), cache_limit=4096)
    with pytest.raises(ShardSpecError, match=r"none of them exists: s3://data/wds/shard-000007.tar"):
        open_dataset(f"{url}/shard-{{000007..000009}}.tar", storage_options=s3, cache_dir=cache)
    with pytest.raises(ShardSpecError, match=r"1 of 4 do not exist: s3://data/wds/shard-000003.tar"):
        open_dataset(f"{url}/shard-{{000000..000003}}.tar", storage_options=s3, cache_dir=cache)


def test_packer_shards_in_s3_open_the_dataset_and_info_prints_the_url(s3, tiny_folder, tmp_path, capsys):  # noqa: F811
    src, _ = tiny_folder
    local = pack(src, str(tmp_path / "tar"), "tar", writer={"shard_samples": 5}).output
    url = _put(s3, local, "ours")
    opts = _cli_options(s3, str(tmp_path / "cache"))
    assert main(["info", url, *opts]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("shards"))
    pattern = f"{url}/shard-{{000000..000002}}.tar"
    assert f": {pattern} (a brace pattern" in line
    ds = open_dataset(pattern, storage_options=s3, cache_dir=str(tmp_path / "cache"))
    assert ds.manifest == open_dataset(local).manifest  # all of its shards: the dataset, class names and all
    assert main(["info", pattern, *opts]) == 0
    assert "samples     14" in capsys.readouterr().out


def test_convert_a_pattern_of_shards_in_s3(s3, tmp_path):  # noqa: F811
    written = _write_wds(str(tmp_path / "wds"))
    url = _put(s3, str(tmp_path / "wds"), "conv")
    dst = str(tmp_path / "lmdb")
    assert main(["convert", "tar", "lmdb", f"{url}/shard-{{000000..000002}}.tar", dst, "-q", "--workers", "1",
                 *_cli_options(s3, str(tmp_path / "cache"))]) == 0
    assert _records(open_dataset(dst)) == written
