"""How ``table-v3-datasets.tar.gz`` was made: the first datasets whose sample table is version 3
(a CRC32C per section, class labels in the narrowest column). Three 6 x 8 PNG samples in every
format, class labels 0, 2, 1 with metadata on one (their table's labels a uint8 column), and in
LMDB also the other label kinds (multi, number) and a dataset with boxes.

    python tests/data/make_table_v3.py OUT   # writes OUT/table-v3/NAME and OUT/table-v3-datasets.tar.gz
"""

import os
import shutil
import struct
import sys
import tarfile

import cv2
import numpy as np

from packer.description.registry import format_names
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items

CLASSES = ["a", "b", "c"]
LABELS = [0, 2, 1]
META = [None, {"n": 1, "caption": "two"}, None]


def images() -> list[bytes]:
    """The three samples' PNG bytes."""
    rng = np.random.default_rng(34)
    return [cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))[1].tobytes() for _ in range(3)]


def main(out: str) -> None:
    root = os.path.join(out, "table-v3")
    shutil.rmtree(root, ignore_errors=True)
    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png")))
    keys = [f"s{k}" for k in range(3)]
    pngs = images()
    for fmt in format_names():
        convert_items([(img, CLASSES[lab], meta) for img, lab, meta in zip(pngs, LABELS, META)],
                      os.path.join(root, fmt), fmt, opts, CLASSES, keys=keys)
    convert_items([(img, [["a", "c"], [], ["b"]][k], None) for k, img in enumerate(pngs)],
                  os.path.join(root, "lmdb-multi"), "lmdb", opts, CLASSES, keys=keys, label_kind="multi")
    convert_items([(img, [0.5, -2.0, 7.25][k], None) for k, img in enumerate(pngs)],
                  os.path.join(root, "lmdb-number"), "lmdb", opts, [], keys=keys, label_kind="number")
    convert_items([(img, CLASSES[LABELS[k]], None, {"boxes": [[0, 0, 4, 3], [1, 2, 8, 6]][: k], "box_labels": [1] * k})
                   for k, img in enumerate(pngs)], os.path.join(root, "lmdb-boxes"), "lmdb", opts, CLASSES, keys=keys)
    for name in os.listdir(root):
        with open(os.path.join(root, name, "samples.table"), "rb") as f:
            if struct.unpack("<4sH", f.read(6)) != (b"PKST", 3):
                raise SystemExit("this packer writes another sample table version: run it with the one that wrote 3")

    def plain(t: tarfile.TarInfo) -> tarfile.TarInfo:
        t.mtime, t.uid, t.gid, t.uname, t.gname = 0, 0, 0, "", ""
        return t

    with tarfile.open(os.path.join(out, "table-v3-datasets.tar.gz"), "w:gz") as tf:
        tf.add(root, "table-v3", filter=plain)


if __name__ == "__main__":
    main(sys.argv[1])
