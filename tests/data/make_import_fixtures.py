"""Writes the importer fixtures in tests/data/importers/ with the real libraries.

MDS and LitData (mosaicml-streaming, litdata and pillow in one venv):
    python tests/data/make_import_fixtures.py mds litdata
Parquet (Hugging Face ``datasets`` and pillow in another venv; pyarrow comes with it):
    python tests/data/make_import_fixtures.py parquet
Every fixture holds the same six samples: the JPEGs in images/, labels 0, 1, 2, 0, 1, 2 (classes
cat, dog, fox), and the metadata columns caption (text), score (float) and extra (JSON).
"""

from __future__ import annotations

import os
import shutil
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "importers")
IMAGES = os.path.join(HERE, "images")
CLASSES = ["cat", "dog", "fox"]
LABELS = [0, 1, 2, 0, 1, 2]
MDS_COMPRESSIONS = [None, "zstd:7", "gz:5", "bz2:9", "snappy", "br:4"]


def captions() -> list[str]:
    return [f"a {CLASSES[c]} number {i}" for i, c in enumerate(LABELS)]


def scores() -> list[float]:
    return [0.5 + i / 8 for i in range(len(LABELS))]


def extras() -> list[dict]:
    return [{"source": "fixture", "tags": [i, i * 2]} for i in range(len(LABELS))]


def make_images() -> list[str]:
    """Six tiny JPEGs of distinct colours and sizes (the samples' source images)."""
    import numpy as np
    from PIL import Image

    os.makedirs(IMAGES, exist_ok=True)
    paths = []
    for i in range(len(LABELS)):
        h, w = 12 + 2 * i, 16 + i
        yy, xx = np.mgrid[0:h, 0:w]
        pixels = np.stack([(xx * 15 + i * 40) % 256, (yy * 20) % 256, np.full_like(xx, 60 * (i % 4))], axis=2)
        path = os.path.join(IMAGES, f"{i}.jpg")
        if not os.path.exists(path):
            Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def rgb(path: str):
    """The decoded pixels of a source image, as a PIL image in RGB."""
    from PIL import Image

    return Image.open(path).convert("RGB")


def write_mds() -> None:
    from PIL import Image
    from streaming import MDSWriter

    paths = make_images()
    rows = list(zip(paths, LABELS, captions(), scores(), extras()))
    columns = {"label": "int", "caption": "str", "score": "float64", "extra": "json"}
    for compression in MDS_COMPRESSIONS:
        out = os.path.join(HERE, "mds-jpeg-" + (compression or "none").split(":")[0])
        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=out, columns={"image": "jpeg", **columns}, compression=compression,
                       size_limit=4096) as w:
            for path, label, caption, score, extra in rows:
                w.write({"image": Image.open(path), "label": label, "caption": caption, "score": score,
                         "extra": extra})
    for encoding in ("png", "pil", "bytes"):
        out = os.path.join(HERE, f"mds-{encoding}-none")
        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=out, columns={"image": encoding, **columns}) as w:
            for path, label, caption, score, extra in rows:
                image = open(path, "rb").read() if encoding == "bytes" else rgb(path)
                w.write({"image": image, "label": label, "caption": caption, "score": score, "extra": extra})
    out = os.path.join(HERE, "mds-arrays")  # arrays of a fixed and of a per-sample dtype and shape
    shutil.rmtree(out, ignore_errors=True)
    import numpy as np

    with MDSWriter(out=out, columns={"image": "jpeg", "label": "int", "fixed": "ndarray:float32:2",
                                     "free": "ndarray", "count": "uint16", "id": "str_int"}) as w:
        for i, (path, label) in enumerate(zip(paths, LABELS)):
            w.write({"image": Image.open(path), "label": label, "fixed": np.array([i, 0.5], np.float32),
                     "free": np.arange(i + 1, dtype=np.int16).reshape(1, -1), "count": i, "id": 10 * i})
    out = os.path.join(HERE, "mds-pkl")
    shutil.rmtree(out, ignore_errors=True)
    with MDSWriter(out=out, columns={"image": "jpeg", "label": "int", "boxes": "pkl"}) as w:
        for path, label in zip(paths, LABELS):
            w.write({"image": Image.open(path), "label": label, "boxes": [(1, 2, 3, 4)]})


def _litdata_sample(i: int, kind: str) -> dict:
    from PIL import Image

    path = os.path.join(IMAGES, f"{i}.jpg")
    image = Image.open(path) if kind == "jpeg" else rgb(path)
    return {"image": image, "label": LABELS[i], "caption": captions()[i], "score": scores()[i]}


def _litdata_arrays(i: int) -> dict:
    import numpy as np
    from PIL import Image

    return {"image": Image.open(os.path.join(IMAGES, f"{i}.jpg")), "label": LABELS[i], "flag": i % 2 == 0,
            "grid": np.full((2, 2), i, np.int32), "row": np.arange(i + 1, dtype=np.float64)}


def _litdata_pickled(i: int) -> dict:
    from PIL import Image

    return {"image": Image.open(os.path.join(IMAGES, f"{i}.jpg")), "label": LABELS[i], "boxes": {1, 2}}


def _litdata_json(i: int) -> dict:
    """Lists and dicts as values: LitData keeps each list as one leaf of its ``json`` serializer."""
    from PIL import Image

    return {"image": Image.open(os.path.join(IMAGES, f"{i}.jpg")), "label": LABELS[i], "tags": [i, i * 2],
            "words": ["a", CLASSES[LABELS[i]]], "weights": [0.5, i / 4], "flags": [i % 2 == 0, True],
            "boxes": [[1, 2, 3, 4 + i]], "objects": [{"name": CLASSES[LABELS[i]], "area": i, "hidden": None}],
            "mixed": [i, "x", None], "empty": [], "extra": {"source": "fixture", "seen": [i]}}


def write_litdata() -> None:
    import functools

    from litdata import optimize

    make_images()
    # zstd wraps a whole chunk file, batches of items (LitData's default) or each item
    for kind, compression, level in (("jpeg", None, None), ("jpeg", "zstd", "chunk"), ("jpeg", "zstd", "batch"),
                                     ("jpeg", "zstd", "sample"), ("pil", None, None), ("pil", "zstd", "batch")):
        out = os.path.join(HERE, f"litdata-{kind}-" + (f"zstd-{level}" if compression else "none"))
        shutil.rmtree(out, ignore_errors=True)
        optimize(fn=functools.partial(_litdata_sample, kind=kind), inputs=list(range(len(LABELS))), output_dir=out,
                 chunk_bytes="4kb", num_workers=1, compression=compression, compression_level=level,
                 mode="overwrite")
    out = os.path.join(HERE, "litdata-arrays")
    shutil.rmtree(out, ignore_errors=True)
    optimize(fn=_litdata_arrays, inputs=list(range(len(LABELS))), output_dir=out, chunk_bytes="64kb",
             num_workers=1, mode="overwrite")
    out = os.path.join(HERE, "litdata-json")
    shutil.rmtree(out, ignore_errors=True)
    optimize(fn=_litdata_json, inputs=list(range(len(LABELS))), output_dir=out, chunk_bytes="64kb",
             num_workers=1, mode="overwrite")
    out = os.path.join(HERE, "litdata-pickle")
    shutil.rmtree(out, ignore_errors=True)
    optimize(fn=_litdata_pickled, inputs=list(range(len(LABELS))), output_dir=out, chunk_bytes="64kb",
             num_workers=1, mode="overwrite")


def write_parquet() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import datasets

    paths = make_images()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "caption": datasets.Value("string"), "score": datasets.Value("float64")})
    # images as {bytes, path} (what a dataset loaded from the Hub holds; to_parquet writes what the table has)
    images = [{"bytes": open(p, "rb").read(), "path": os.path.basename(p)} for p in paths]
    ds = datasets.Dataset.from_dict({"image": images, "label": LABELS, "caption": captions(), "score": scores()},
                                    features=features)
    ds.to_parquet(os.path.join(HERE, "hf.parquet"))
    # A plain Parquet file: an image column of bytes, class names as text, no Hugging Face metadata.
    table = pa.table({"jpg": [open(p, "rb").read() for p in paths], "class": [CLASSES[c] for c in LABELS],
                      "caption": captions(), "score": scores()})
    pq.write_table(table, os.path.join(HERE, "plain.parquet"), compression="zstd")


if __name__ == "__main__":
    for what in sys.argv[1:] or ["mds", "litdata"]:
        {"mds": write_mds, "litdata": write_litdata, "parquet": write_parquet}[what]()
