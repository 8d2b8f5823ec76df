"""A dataset with masks and boxes streamed from object storage (a moto S3 server on 127.0.0.1):
every rank's share, fields intact, through a DataLoader with collate, and a resumed epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from packer.datasets import StreamingDataset, collate, open_dataset
from packer.datasets.world import World
from tests.helpers import import_optional, write_fields_dataset
from tests.storage.test_remote import _upload, s3  # noqa: F401 - the moto server fixture

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")

FIELDS = ("key", "image", "mask", "boxes", "box_labels", "label")


def _by_key(ds):
    out = {}
    for s in (ds[i] for i in range(len(ds))):
        out[s["key"]] = s
    return out


def test_a_fields_dataset_streams_from_s3_on_two_ranks_and_resumes(s3, tmp_path):  # noqa: F811
    local = tmp_path / "seg.tar"
    write_fields_dataset(local, "tar", n=10, resize="16x16", shard_samples=3)
    url = _upload(s3, str(local), "seg.tar")
    want = _by_key(open_dataset(local, fields=FIELDS, as_dict=True))
    seen = {}
    for rank in (0, 1):
        ds = StreamingDataset(url, world=World(rank, 2), storage_options=s3, cache_dir=str(tmp_path / f"c{rank}"),
                              fields=FIELDS, as_dict=True, seed=3)
        for batch in DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate):
            assert batch["mask"].shape[1:] == (16, 16) and isinstance(batch["boxes"], list)
            for j, key in enumerate(batch["key"]):
                seen.setdefault(key, []).append((batch["image"][j], batch["mask"][j], batch["boxes"][j],
                                                 batch["box_labels"][j]))
    assert set(seen) == set(want) and all(len(c) == 1 for c in seen.values())  # each sample on one rank
    for key, copies in seen.items():
        for image, mask, boxes, labels in copies:
            assert torch.equal(image, want[key]["image"]) and torch.equal(mask, want[key]["mask"])
            assert torch.equal(boxes, want[key]["boxes"]) and torch.equal(labels, want[key]["box_labels"])
    # resume: a new process skips the samples consumed and reads the rest with their fields
    ds = StreamingDataset(url, world=World(0, 2), storage_options=s3, cache_dir=str(tmp_path / "c0"),
                          fields=FIELDS, as_dict=True, seed=3)
    first = [s["key"] for s in ds]
    state = ds.state_dict(samples_consumed=2)
    again = StreamingDataset(url, world=World(0, 2), storage_options=s3, cache_dir=str(tmp_path / "c0"),
                             fields=FIELDS, as_dict=True, seed=3)
    again.load_state_dict(state)
    rest = list(again)
    assert [s["key"] for s in rest] == first[2:]
    for s in rest:
        assert torch.equal(s["mask"], want[s["key"]]["mask"]) and int(s["mask"].max()) == 255  # the ignore region
