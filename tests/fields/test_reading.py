"""Reading a sample's fields (mask, extra images, boxes) on the readers: tuples and dicts, crops,
torchvision v2 transforms over tv_tensors, collate, streaming, the caches. On LMDB datasets made
by tests.helpers.write_fields_dataset (every format's reader shares this path)."""

import random

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import StreamingDataset, collate, open_dataset, prefetch_to_device
from packer.datasets.crops import RandomCrop, RandomResizedCrop
from packer.datasets.world import World
from packer.errors import CorruptDataError
from packer.images.imageproc import decode_payload
from tests.helpers import import_optional, write_fields_dataset

ALL = ("image", "mask", "left", "boxes", "box_labels", "label", "key")


@pytest.fixture(scope="module")
def fields_lmdb(tmp_path_factory):
    dst = tmp_path_factory.mktemp("fields") / "f.lmdb"
    return dst, write_fields_dataset(dst, "lmdb", n=6)


def _stored(ds, i):
    """(image, mask, left) of sample i decoded whole from its record, boxes and labels from the table."""
    rec = ds.read_record(i)
    image = decode_payload(rec.payload, rec.codec, rec.height, rec.width)
    mask = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
    left = decode_payload(rec.fields[1].payload, rec.fields[1].codec, rec.height, rec.width)
    boxes, labels = ds.sample_table().boxes_of(i)
    return image, mask, left, boxes, labels


def test_fields_come_as_tuples_and_dicts_equal_to_the_stored_sample(fields_lmdb):
    path, src = fields_lmdb
    with open_dataset(path, fields=ALL) as ds, open_dataset(path, fields=ALL, as_dict=True, output="numpy") as dd:
        for i in range(len(ds)):
            image, mask, left, boxes, labels, label, key = ds[i]
            want = _stored(ds, i)
            assert mask.dtype == torch.uint8 and mask.shape == want[1].shape == image.shape[1:]
            np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), want[0])
            np.testing.assert_array_equal(mask.numpy(), want[1])
            np.testing.assert_array_equal(left.permute(1, 2, 0).numpy(), want[2])
            h, w = want[1].shape
            src_mask = src[i][4]
            np.testing.assert_array_equal(mask.numpy(), cv2.resize(src_mask, (w, h), interpolation=cv2.INTER_NEAREST))
            assert boxes.dtype == torch.float32 and boxes.shape == (len(src[i][6]), 4)
            scale = np.array([w / src_mask.shape[1], h / src_mask.shape[0]] * 2)
            np.testing.assert_allclose(boxes.numpy(), np.array(src[i][6]).reshape(-1, 4) * scale, atol=0.5)
            assert labels.dtype == torch.int64 and labels.tolist() == src[i][7]
            assert (label, key) == (src[i][2], src[i][0])
            d = dd[i]
            assert list(d) == list(ALL) and isinstance(d["mask"], np.ndarray)
            np.testing.assert_array_equal(d["mask"], want[1])


def test_unknown_field_is_refused_naming_the_datasets_fields(fields_lmdb, tmp_path):
    with pytest.raises(ValueError, match=r"has its fields: mask, left, boxes, box_labels"):
        open_dataset(fields_lmdb[0], fields=("image", "right"))
    plain = tmp_path / "plain.lmdb"
    write_fields_dataset(plain, "lmdb", n=2, mask=False, boxes=False)
    with pytest.raises(ValueError, match=r"has its fields: left\)"):
        open_dataset(plain, fields=("image", "mask"))


def _damaged_mask(src, dst, i):
    """A copy of dataset ``src`` at ``dst`` with 8 bytes inside sample ``i``'s mask PNG overwritten."""
    import shutil

    shutil.copytree(src, dst)
    with open_dataset(dst) as ds:
        png = bytes(ds.read_record(i).fields[0].payload)
    data = (dst / "data.mdb").read_bytes()
    at = data.index(png) + len(png) // 2  # inside the mask's compressed rows
    (dst / "data.mdb").write_bytes(data[:at] + b"\xff" * 8 + data[at + 8:])
    return dst


def test_a_field_is_decoded_only_when_asked_for(fields_lmdb, tmp_path):
    path = _damaged_mask(fields_lmdb[0], tmp_path / "damaged.lmdb", 1)
    with open_dataset(path, fields=("image", "left", "boxes", "label"), verify=False) as ds:
        assert ds[1][0].shape[0] == 3  # the mask is never decoded
    with open_dataset(path, fields=("image", "mask"), verify=False) as ds:
        with pytest.raises(CorruptDataError, match=r"mask 'mask'.*sample 1"):
            ds[1]


def test_encoded_output_gives_the_stored_bytes_of_each_field(fields_lmdb):
    with open_dataset(fields_lmdb[0], output="encoded", fields=("image", "mask", "left", "boxes", "info")) as ds:
        payload, mask, left, boxes, info = ds[2]
        rec = ds.read_record(2)
        assert bytes(mask.numpy()) == bytes(rec.fields[0].payload)
        assert bytes(left.numpy()) == bytes(rec.fields[1].payload)
        assert bytes(payload.numpy()) == bytes(rec.payload) and info == (rec.height, rec.width, rec.codec, 2)
        np.testing.assert_array_equal(boxes.numpy(), ds.sample_table().boxes_of(2)[0])


def _moved(boxes, labels, top, left, h, w, out=None):
    """Boxes of a crop by hand: shifted, clipped, empty ones dropped, scaled to ``out``."""
    b = boxes - np.array([left, top, left, top], np.float32)
    b[:, 0::2] = b[:, 0::2].clip(0, w)
    b[:, 1::2] = b[:, 1::2].clip(0, h)
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    b, labels = b[keep], labels[keep]
    if out is not None:
        b = b * np.array([out[1] / w, out[0] / h] * 2, np.float32)
    return b, labels


@pytest.mark.parametrize("crop", [16, RandomCrop((14, 20)), RandomResizedCrop(12, scale=(0.2, 0.6))])
def test_crop_cuts_image_mask_and_extra_images_with_one_window_and_moves_boxes(fields_lmdb, crop):
    path = fields_lmdb[0]
    with open_dataset(path, fields=("image", "mask", "left", "boxes", "box_labels"), crop=crop,
                      output="numpy") as ds:
        for i in range(len(ds)):
            seed = 100 + i
            random.seed(seed)
            image, mask, left, boxes, labels = ds[i]
            whole, wmask, wleft, wboxes, wlabels = _stored(ds, i)
            random.seed(seed)
            top, lft, h, w = ds.crop.window(*wmask.shape)
            cut = (slice(top, top + h), slice(lft, lft + w))
            if isinstance(crop, RandomResizedCrop):
                want_mask = cv2.resize(wmask[cut], (12, 12), interpolation=cv2.INTER_NEAREST)
                out = (12, 12)
                np.testing.assert_array_equal(image, ds.crop.finish(whole[cut]))
            else:
                want_mask, out = wmask[cut], None
                np.testing.assert_array_equal(image, whole[cut])
                np.testing.assert_array_equal(left, wleft[cut])
            np.testing.assert_array_equal(mask, want_mask)
            want_boxes, want_labels = _moved(wboxes, wlabels, top, lft, h, w, out)
            np.testing.assert_allclose(boxes, want_boxes, atol=1e-4)
            np.testing.assert_array_equal(labels, want_labels)


def test_crop_drops_boxes_left_without_area_with_their_labels(fields_lmdb):
    class Corner(RandomCrop):
        def window(self, height, width):
            return height - 4, width - 4, 4, 4  # the bottom-right corner: the first box is outside

    with open_dataset(fields_lmdb[0], fields=("boxes", "box_labels"), crop=Corner(4)) as ds:
        full = ds.sample_table().boxes_of(2)
        boxes, labels = ds[2]
        assert len(full[0]) == 2 and boxes.shape == (1, 4) and labels.tolist() == full[1][1:].tolist()


def _find_window(out, whole):
    """(top, left, flipped) at which ``out`` (H x W x C) is a cut of ``whole``, flipped or not."""
    h, w = out.shape[:2]
    for flipped in (False, True):
        src = whole[:, ::-1] if flipped else whole
        for top in range(whole.shape[0] - h + 1):
            for left in range(whole.shape[1] - w + 1):
                if np.array_equal(src[top:top + h, left:left + w], out):
                    return top, (whole.shape[1] - left - w if flipped else left), flipped
    raise AssertionError("the transformed image is no crop of the stored one")


def test_v2_random_crop_and_flip_keep_image_mask_and_boxes_aligned(fields_lmdb):
    v2 = import_optional("torchvision.transforms.v2", "torchvision (transforms v2)")
    tv_tensors = import_optional("torchvision.tv_tensors", "torchvision (tv_tensors)")
    pipeline = v2.Compose([v2.RandomCrop((14, 18)), v2.RandomHorizontalFlip(0.5)])
    names = ("image", "mask", "left", "boxes", "label")
    with open_dataset(fields_lmdb[0], fields=names, output="tv_tensors", transforms=pipeline) as ds:
        flips = set()
        for i in range(len(ds)):
            for seed in range(4):
                torch.manual_seed(seed)
                image, mask, left, boxes, label = ds[i]
                assert isinstance(image, tv_tensors.Image) and isinstance(mask, tv_tensors.Mask)
                assert isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.canvas_size == (14, 18)
                whole, wmask, wleft, wboxes, wlabels = _stored(ds, i)
                top, lft, flipped = _find_window(image.permute(1, 2, 0).numpy(), whole)
                flips.add(flipped)
                src_mask, src_left = (wmask[:, ::-1], wleft[:, ::-1]) if flipped else (wmask, wleft)
                x0 = wmask.shape[1] - lft - 18 if flipped else lft
                np.testing.assert_array_equal(mask.numpy(), src_mask[top:top + 14, x0:x0 + 18])
                np.testing.assert_array_equal(left.permute(1, 2, 0).numpy(), src_left[top:top + 14, x0:x0 + 18])
                want, _ = _moved(wboxes, wlabels, top, lft, 14, 18)
                if flipped:
                    want = np.stack([18 - want[:, 2], want[:, 1], 18 - want[:, 0], want[:, 3]], 1)
                kept = boxes.as_subclass(torch.Tensor).numpy()
                kept = kept[(kept[:, 2] > kept[:, 0]) & (kept[:, 3] > kept[:, 1])]
                np.testing.assert_allclose(kept, want, atol=1e-4)
        assert flips == {False, True}


def test_v2_random_resized_crop_resizes_masks_nearest_with_the_images_window(fields_lmdb):
    v2 = import_optional("torchvision.transforms.v2", "torchvision (transforms v2)")
    tv_tensors = import_optional("torchvision.tv_tensors", "torchvision (tv_tensors)")
    pipeline = v2.RandomResizedCrop((20, 20), scale=(0.3, 0.9), antialias=True)
    with open_dataset(fields_lmdb[0], fields=("image", "mask"), output="tv_tensors", transforms=pipeline,
                      as_dict=True) as ds, open_dataset(fields_lmdb[0], fields=("image", "mask"),
                                                        output="tv_tensors") as plain:
        for i in range(len(ds)):
            torch.manual_seed(i)
            got = ds[i]
            image, mask = plain[i]
            torch.manual_seed(i)
            want_image = pipeline(image)
            torch.manual_seed(i)
            want_mask = pipeline(tv_tensors.Mask(mask))
            assert torch.equal(got["image"], want_image) and torch.equal(got["mask"], want_mask)
            assert set(got["mask"].unique().tolist()) <= set(mask.unique().tolist())


def test_collate_stacks_images_and_masks_and_lists_boxes_through_workers(fields_lmdb):
    ds = open_dataset(fields_lmdb[0], fields=("image", "mask", "boxes", "box_labels", "label"), crop=16,
                      as_dict=True)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate)
    seen = 0
    for batch in prefetch_to_device(loader, "cpu"):
        assert batch["image"].shape == (3, 3, 16, 16) and batch["mask"].shape == (3, 16, 16)
        assert isinstance(batch["boxes"], list) and len(batch["boxes"]) == 3
        for k in range(3):
            i = seen + k
            np.testing.assert_array_equal(batch["mask"][k].numpy(), ds[i]["mask"].numpy())
            assert torch.equal(batch["boxes"][k], ds[i]["boxes"]) and torch.equal(batch["box_labels"][k],
                                                                                 ds[i]["box_labels"])
        seen += 3
    assert seen == len(ds)


def test_collate_lists_bounding_boxes_in_tuples(fields_lmdb):
    import_optional("torchvision.tv_tensors", "torchvision (tv_tensors)")
    ds = open_dataset(fields_lmdb[0], fields=("image", "boxes", "label"), crop=16, output="tv_tensors")
    for workers in (0, 2):
        images, boxes, labels = next(iter(DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=collate)))
        assert images.shape == (3, 3, 16, 16) and [len(b) for b in boxes] == [len(ds[i][1]) for i in range(3)]
        assert labels.tolist() == [ds[i][2] for i in range(3)]


def test_streaming_reads_fields_on_two_ranks(fields_lmdb):
    path, src = fields_lmdb
    keys = []
    for rank in range(2):
        ds = StreamingDataset(path, world=World(rank, 2), fields=("key", "mask", "boxes", "image"), as_dict=True,
                              block_samples=2)
        for sample in ds:
            i = [s[0] for s in src].index(sample["key"])
            assert sample["mask"].shape == sample["image"].shape[1:] and len(sample["boxes"]) == len(src[i][6])
            keys.append(sample["key"])
    assert sorted(keys) == sorted(s[0] for s in src)


def test_encoded_cache_keeps_the_fields_and_decoded_cache_refuses_stored_ones(fields_lmdb):
    path = fields_lmdb[0]
    names = ("image", "mask", "left", "boxes")
    with open_dataset(path, fields=names) as plain, open_dataset(path, fields=names, cache="encoded") as cached:
        for _ in range(2):  # the second pass reads the cache's records
            for i in range(len(plain)):
                for a, b in zip(plain[i], cached[i]):
                    assert torch.equal(a, b)
        assert cached.cache.get(3) is not None
    with pytest.raises(ValueError, match=r"cache='decoded'.*\['left', 'mask'\].*cache='encoded'"):
        open_dataset(path, fields=names, cache="decoded")
    with open_dataset(path, fields=("image", "boxes"), crop=16) as plain, \
            open_dataset(path, fields=("image", "boxes"), crop=16, cache="decoded") as cached:
        for _ in range(2):
            for i in range(len(plain)):
                assert all(torch.equal(a, b) for a, b in zip(plain[i], cached[i]))


def test_collate_lists_plain_boxes_in_the_readers_tuples_and_mixtures(fields_lmdb, tmp_path):
    path = fields_lmdb[0]
    ds = open_dataset(path, fields=("image", "mask", "boxes", "box_labels"), crop=16)
    for workers in (0, 2):
        images, masks, boxes, labels = next(iter(DataLoader(ds, batch_size=3, num_workers=workers,
                                                            collate_fn=collate)))
        assert images.shape == (3, 3, 16, 16) and masks.shape == (3, 16, 16)
        assert [len(b) for b in boxes] == [len(ds[i][2]) for i in range(3)] == [len(x) for x in labels]
    other = tmp_path / "other.lmdb"
    write_fields_dataset(other, "lmdb", n=3, seed=1)
    mix = StreamingDataset([path, other], fields=("boxes", "source", "image"), crop=16, shuffle=False)
    boxes, sources, images = next(iter(DataLoader(mix, batch_size=4, collate_fn=collate)))
    assert isinstance(boxes, list) and len(boxes) == 4 and images.shape == (4, 3, 16, 16) and len(sources) == 4


def test_a_mixtures_transforms_see_its_samples_as_dicts_with_their_source(fields_lmdb, tmp_path):
    other = tmp_path / "other.lmdb"
    write_fields_dataset(other, "lmdb", n=3, seed=1)

    def flip(sample):
        assert isinstance(sample, dict) and set(sample) == {"image", "mask", "source"}
        return {**sample, "mask": sample["mask"].flip(-1)}

    names = ("image", "mask", "source")
    plain = StreamingDataset([fields_lmdb[0], other], fields=names, as_dict=True, shuffle=False)
    mixed = StreamingDataset([fields_lmdb[0], other], fields=names, as_dict=True, shuffle=False, transforms=flip)
    pairs = list(zip(plain, mixed))
    assert len(pairs) == 9 and {a["source"] for a, _ in pairs} == {0, 1}
    for a, b in pairs:
        assert a["source"] == b["source"] and torch.equal(a["mask"].flip(-1), b["mask"])


def test_sixteen_bit_masks_come_back_unchanged_and_as_pil(tmp_path):
    from packer.description.manifest import FIELDS_VERSION, Manifest
    from packer.images.fields import FieldSources, process_sample
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, write_packed
    from tests.helpers import fields_sources

    opts = ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png"))
    items, masks = [], []
    for key, data, label, rgb, *_ in fields_sources(3):
        masks.append((np.arange(rgb.shape[0] * rgb.shape[1]).reshape(rgb.shape[:2]) * 997 % 65536).astype(np.uint16))
        items.append((key, label, process_sample(data, opts, FieldSources(cv2.imencode(".png", masks[-1])[1].tobytes())),
                      None))
    template = Manifest(format="lmdb", num_samples=0, classes=["a", "b"], processing=opts.to_json(), files=[],
                        version=FIELDS_VERSION, fields=[{"name": "mask", "kind": "mask"}], source={"kind": "test"})
    write_packed(str(tmp_path / "m16.lmdb"), "lmdb", items, template, ConvertOptions(processing=opts))
    with open_dataset(tmp_path / "m16.lmdb", fields=("mask", "label")) as ds, \
            open_dataset(tmp_path / "m16.lmdb", fields=("image", "mask"), output="pil") as pil:
        for i, want in enumerate(masks):
            mask, _ = ds[i]
            assert mask.dtype == torch.uint16 and np.array_equal(mask.numpy(), want)
            image, pmask = pil[i]
            assert image.size == pmask.size == want.shape[::-1] and np.array_equal(np.asarray(pmask), want)


def test_a_damaged_mask_is_skipped_like_a_damaged_image(fields_lmdb, tmp_path):
    from packer.datasets.shm.skips import SkippedSampleWarning

    path = _damaged_mask(fields_lmdb[0], tmp_path / "damaged.lmdb", 1)
    with open_dataset(path, fields=("key", "mask"), on_error="skip", verify=False) as ds, pytest.warns(SkippedSampleWarning):
        assert ds[1][0] == fields_lmdb[1][2][0] and ds.errors == 1


def test_collate_encoded_refuses_encoded_fields_saying_why(fields_lmdb):
    from packer.datasets import collate_encoded

    with open_dataset(fields_lmdb[0], output="encoded", fields=("image", "label", "info", "mask")) as ds:
        with pytest.raises(TypeError, match=r"tuple of 4.*masks, extra images, boxes"):
            collate_encoded([ds[0], ds[1]])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "tar", "tfrecord"])
def test_only_the_fields_asked_for_are_read_and_decoded(tmp_path, fmt):
    """A mask asked for alone: tar and HDF5 read no byte of the extra images, TFRecord reads the
    record whole but parses only the mask, LMDB's one value holds them all; none is decoded."""
    write_fields_dataset(tmp_path / "d", fmt, n=3, images=("left", "right"))
    ds = open_dataset(tmp_path / "d", fields=("mask", "label"), as_dict=True)
    rec = ds.read_record(1, fields=("mask",))
    names = [f.name for f in rec.fields]
    assert names == (["mask", "left", "right"] if fmt == "lmdb" else ["mask"])
    assert sorted(ds[1]) == ["label", "mask"] and ds[1]["mask"].ndim == 2
    assert [f.name for f in ds.read_record(1).fields] == ["mask", "left", "right"]
