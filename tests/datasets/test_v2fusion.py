"""torchvision v2 crops fused into the decode: for a given torch seed the fused reader draws
torchvision's windows (the window decode is called with them) and returns exactly what the real
v2 pipeline returns on a whole decode, for tensors, PIL images and tv_tensors with masks and
boxes; pipelines it cannot fuse run as given."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import open_dataset
from packer.datasets.crops import CenterCrop as PackerCenterCrop
from packer.datasets.v2fusion import V2Crop, fusable_reason
from tests.datasets.test_crop import need_module, spy_on_window_decodes
from tests.helpers import import_optional, make_folder, pack, write_fields_dataset

v2 = import_optional("torchvision.transforms.v2", "torchvision (transforms v2)")
tv_tensors = import_optional("torchvision.tv_tensors", "torchvision (tv_tensors)")

ALL = ("image", "mask", "left", "boxes", "box_labels", "label")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """An LMDB of 6 JPEGs, 40-70 px a side."""
    root = tmp_path_factory.mktemp("v2fusion")
    make_folder(str(root / "src"), {c: [(f"{c}{i}.jpg", 40 + 9 * i, 70 - 8 * i) for i in range(3)] for c in "ab"})
    pack(str(root / "src"), str(root / "ds"), "lmdb")
    return str(root / "ds")


@pytest.fixture(scope="module")
def fields_jpeg(tmp_path_factory):
    """An LMDB of 6 JPEG samples with a mask, an extra image ``left`` and 0-2 boxes each."""
    dst = tmp_path_factory.mktemp("v2fields") / "f.lmdb"
    write_fields_dataset(dst, "lmdb", n=6, resize="none", encode="jpeg:90")
    return str(dst)


STEPS = {"resized": lambda: v2.RandomResizedCrop(24, scale=(0.2, 0.9)),
         "resized-nearest": lambda: v2.RandomResizedCrop((20, 28), interpolation=v2.InterpolationMode.NEAREST),
         "random": lambda: v2.RandomCrop((30, 36)), "random-small": lambda: v2.RandomCrop((20, 24)), "center": lambda: v2.CenterCrop((32, 38)),
         "center-padded": lambda: v2.CenterCrop((50, 80))}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b) and (
            getattr(a, "canvas_size", None) == getattr(b, "canvas_size", None))
    if hasattr(a, "mode"):  # PIL
        return a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def _compare(fused, plain, seeds=range(3)) -> None:
    """Every sample of ``fused`` equals ``plain``'s under each torch seed."""
    assert fused.fusion is not None and plain.fusion is None
    for i in range(len(fused)):
        for seed in seeds:
            torch.manual_seed(seed)
            got = fused[i]
            torch.manual_seed(seed)
            want = plain[i]
            assert _same(got, want), (i, seed)


@pytest.mark.parametrize("output", ["tensor", "tv_tensors", "pil"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_fused_pipeline_returns_what_torchvision_returns(photos, step, output):
    pipeline = v2.Compose([STEPS[step](), v2.RandomHorizontalFlip()])
    with open_dataset(photos, transform=pipeline, output=output) as fused, \
            open_dataset(photos, transform=pipeline, output=output, fuse_crop=False) as plain:
        assert isinstance(fused.crop, V2Crop) and fused.crop.step is pipeline.transforms[0]
        assert fused.transform.transforms == pipeline.transforms[1:] and fused.fusion.pipeline is pipeline
        assert plain.transform is pipeline and plain.crop is None
        _compare(fused, plain)


def test_the_window_decode_gets_torchvisions_windows(photos, monkeypatch):
    need_module()
    step = v2.RandomResizedCrop(24)
    with open_dataset(photos, transform=v2.Compose([step, v2.RandomHorizontalFlip()])) as fused, \
            open_dataset(photos) as whole:
        assert fused.crop.quick  # the draw on reused tensors, checked against the step's own at open
        calls = spy_on_window_decodes(monkeypatch)
        for i in range(len(fused)):
            torch.manual_seed(i)
            fused[i]
            image = whole[i][0]
            torch.manual_seed(i)
            p = step.make_params([image])
            top, left, width = calls[-1]
            assert (top, left, width) == (p["top"], p["left"], p["width"])
        assert len(calls) == len(fused)


@pytest.mark.parametrize("step", ["resized", "random-small", "center", "center-padded"])
def test_masks_extra_images_and_boxes_move_as_torchvision_moves_them(fields_jpeg, step):
    pipeline = v2.Compose([STEPS[step](), v2.RandomHorizontalFlip()])
    for as_dict in (False, True):
        with open_dataset(fields_jpeg, fields=ALL, output="tv_tensors", transforms=pipeline, as_dict=as_dict) as fused, \
                open_dataset(fields_jpeg, fields=ALL, output="tv_tensors", transforms=pipeline, as_dict=as_dict,
                             fuse_crop=False) as plain:
            assert fused.fusion.source == "transforms"
            _compare(fused, plain, seeds=range(4))
    with open_dataset(fields_jpeg, fields=ALL, output="tv_tensors", transforms=pipeline, as_dict=True) as fused:
        boxes = [fused[i]["boxes"] for i in range(len(fused)) for _ in range(3)]
        assert any(len(b) for b in boxes) and all(b.canvas_size == fused.crop.size for b in boxes)


def test_batches_and_the_decoded_cache_are_fused_alike(photos):
    pipeline = v2.Compose([v2.RandomResizedCrop(20), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32)])
    plain = open_dataset(photos, transform=pipeline, fuse_crop=False)
    for cache in (None, "decoded"):
        with open_dataset(photos, transform=pipeline, cache=cache) as fused:
            for _ in range(2):  # the second epoch reads the cache
                torch.manual_seed(5)
                got = list(DataLoader(fused, batch_size=4, generator=torch.Generator().manual_seed(3), shuffle=True))
                torch.manual_seed(5)
                want = list(DataLoader(plain, batch_size=4, generator=torch.Generator().manual_seed(3), shuffle=True))
                assert _same(got, want)


class _MyCrop(v2.RandomResizedCrop):
    pass


UNFUSED = {"colour first": lambda: v2.Compose([v2.ColorJitter(0.5), v2.RandomResizedCrop(24)]),
           "padding": lambda: v2.RandomCrop(30, padding=4), "pad if needed": lambda: v2.RandomCrop(80, pad_if_needed=True),
           "a subclass": lambda: _MyCrop(24), "flip first": lambda: v2.Compose([v2.RandomHorizontalFlip(), v2.CenterCrop(30)])}


@pytest.mark.parametrize("name", sorted(UNFUSED))
def test_pipelines_it_cannot_fuse_run_as_given(photos, name):
    pipeline = UNFUSED[name]()
    assert fusable_reason(pipeline) is not None
    with open_dataset(photos, transform=pipeline) as ds, open_dataset(photos) as whole:
        assert ds.fusion is None and ds.crop is None and ds.transform is pipeline
        for i in range(len(ds)):
            torch.manual_seed(i)
            got = ds[i][0]
            torch.manual_seed(i)
            assert torch.equal(got, pipeline(whole[i][0]))


def test_readers_whose_samples_v2_would_crop_otherwise_run_unfused(photos, fields_jpeg):
    step = v2.RandomResizedCrop(24)
    assert fusable_reason(step) is None and fusable_reason(lambda x: x) is not None
    cases = [dict(path=photos, transform=step, output="numpy"),  # v2 leaves arrays alone
             dict(path=photos, transform=step, crop=30),  # the reader's crop goes first
             dict(path=photos, transform=lambda x: x, transforms=step),  # transform runs before transforms
             dict(path=fields_jpeg, transform=step, fields=("image", "mask")),  # transform sees the image alone
             dict(path=fields_jpeg, transforms=step, fields=("image", "mask")),  # a plain mask tensor stays whole
             dict(path=photos, transform=step, fuse_crop=False)]
    for case in cases:
        with open_dataset(case.pop("path"), **case) as ds:
            assert ds.fusion is None and ds.transform is case.get("transform") and ds.transforms is case.get("transforms")
            assert ds.crop is None or isinstance(ds.crop, PackerCenterCrop)


def test_a_single_step_is_fused_whole_and_pickles(photos):
    import pickle

    step = v2.CenterCrop(30)
    with open_dataset(photos, transform=step) as fused, open_dataset(photos, transform=step, fuse_crop=False) as plain:
        assert fused.transform is None and fused.fusion.rest is None
        copy = pickle.loads(pickle.dumps(fused))  # as a spawned DataLoader worker gets it
        assert isinstance(copy.crop, V2Crop) and _same(copy[0], plain[0])
        _compare(fused, plain, seeds=[0])


def test_opencv_resize_keeps_the_windows_and_gives_close_pixels(photos):
    pipeline = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])
    with open_dataset(photos, transform=pipeline, fuse_crop="opencv") as fast, \
            open_dataset(photos, transform=pipeline, fuse_crop=False) as plain:
        assert fast.crop.resize == "opencv"
        for i in range(len(fast)):
            torch.manual_seed(i)
            got = fast[i][0]
            after = torch.rand(1)
            torch.manual_seed(i)
            want = plain[i][0]
            assert torch.equal(after, torch.rand(1)) and got.shape == want.shape == (3, 24, 24)
            diff = (got.float() - want.float()).abs()
            assert diff.mean() < 6 and diff.max() < 128
    with pytest.raises(ValueError, match="fuse_crop must be"):
        open_dataset(photos, transform=pipeline, fuse_crop="fast")


def test_a_step_the_quick_draw_does_not_match_draws_with_its_own_make_params(photos):
    step = v2.RandomResizedCrop(24)
    step.ratio = (0.5, 2.0)  # make_params still draws with the ratio given to __init__
    with open_dataset(photos, transform=step) as fused, open_dataset(photos, transform=step, fuse_crop=False) as plain:
        assert not fused.crop.quick
        _compare(fused, plain)


def test_opencv_fusion_cuts_masks_by_the_reduced_decodes_widened_window(fields_jpeg):
    step = v2.RandomResizedCrop(12, scale=(0.6, 1.0))
    with open_dataset(fields_jpeg, fields=("image", "mask"), output="tv_tensors", transforms=step,
                      fuse_crop="opencv") as fast, open_dataset(fields_jpeg, fields=("image", "mask")) as whole:
        reduced = 0
        for i in range(len(fast)):
            full_mask = whole[i][1].numpy()
            h, w = full_mask.shape[:2]
            torch.manual_seed(i)
            scale, (t, x0, wh, ww) = fast.crop.reduction(fast.crop.window(h, w), h, w)
            reduced += scale > 1
            torch.manual_seed(i)
            image, mask = fast[i]
            want = fast.crop.finish_mask(np.ascontiguousarray(full_mask[t:t + wh, x0:x0 + ww]))
            assert tuple(image.shape[-2:]) == tuple(mask.shape[-2:]) == (12, 12)
            np.testing.assert_array_equal(mask.numpy(), want)
        assert reduced  # some windows were decoded at reduced scale
