"""How ``v3-fields-datasets.tar.gz`` was made: three 6 x 8 PNG samples with a mask (two 8-bit, one
16-bit, as a dataset whose masks mix the two had them) and boxes with labels, in every format,
written by packer when the fields manifest was version 3 (it refuses to run with a later one).

    python tests/data/make_v3_fields.py OUT   # writes OUT/v3-fields/FORMAT and OUT/v3-fields-datasets.tar.gz
"""

import json
import os
import shutil
import sys
import tarfile

import cv2
import numpy as np

from packer.description.registry import format_names
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items


def masks() -> list[np.ndarray]:
    """The three samples' masks: 8-bit, 16-bit (values over 255), 8-bit."""
    return [(np.arange(48).reshape(6, 8) % (5 + k)).astype(np.uint8) if k != 1
            else (np.arange(48).reshape(6, 8) * 1000).astype(np.uint16) for k in range(3)]


def main(out: str) -> None:
    root = os.path.join(out, "v3-fields")
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(3)
    items = []
    for k, mask in enumerate(masks()):
        img = cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))[1].tobytes()
        boxes = [[0, 0, 4, 3], [1, 2, 8, 6], [2, 1, 5, 5]][: k + 1]
        items.append((img, ["a", "b"][k % 2], {"n": k},
                      {"mask": cv2.imencode(".png", mask)[1].tobytes(), "boxes": boxes, "box_labels": [k % 2] * (k + 1)}))
    processing = ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png"))
    for fmt in format_names():
        convert_items(items, os.path.join(root, fmt), fmt, ConvertOptions(processing=processing), ["a", "b"],
                      keys=[f"s{k}" for k in range(3)])
        with open(os.path.join(root, fmt, "manifest.json")) as f:
            if json.load(f)["version"] != 3:
                raise SystemExit("this packer writes a later version: run it with packer 0.2 before version 4")

    def plain(t: tarfile.TarInfo) -> tarfile.TarInfo:
        t.mtime, t.uid, t.gid, t.uname, t.gname = 0, 0, 0, "", ""
        return t

    with tarfile.open(os.path.join(out, "v3-fields-datasets.tar.gz"), "w:gz") as tf:
        tf.add(root, "v3-fields", filter=plain)


if __name__ == "__main__":
    main(sys.argv[1])
