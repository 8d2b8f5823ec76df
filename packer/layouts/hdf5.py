"""The HDF5 layout: one file, ``data.h5``; docs/FORMATS.md ("HDF5") describes every dataset and
attribute, and why payloads are a flat byte array plus offsets.

The one home of the format's on-disk knowledge: the writer (packer.converters.hdf5), the reader
(packer.datasets.formats.hdf5) and the tests import it.
"""

import os

__all__ = ["DATA_FILE", "LAYOUT_VERSION", "FIELDS_LAYOUT_VERSION", "LAYOUT_VERSIONS", "CHUNK_BYTES", "LIBVER",
           "FIELDS_GROUP", "BOX_DATASETS", "field_group", "identify"]

DATA_FILE = "data.h5"
LAYOUT_VERSION = 2  # 2: /crc32c seeded with each sample's place (packer.description.placement); the file_id attribute
FIELDS_LAYOUT_VERSION = 3  # 3: samples with fields (masks, extra images under /fields/NAME, boxes)
LAYOUT_VERSIONS = (1, 2, 3)  # readable
CHUNK_BYTES = 1 << 20  # payload chunk size
LIBVER = ("earliest", "v110")  # pinned file format: identical input gives identical bytes
FIELDS_GROUP = "fields"  # version 3: one group per mask or extra image, /fields/NAME
BOX_DATASETS = ("boxes", "box_offsets", "box_labels")  # version 3 with boxes: a copy of the table's, for h5py users


def field_group(name: str) -> str:
    """The path of field ``name``'s group (its ``images``, ``offsets``, ``shapes``, ``crc32c``)."""
    return f"{FIELDS_GROUP}/{name}"


def identify(directory: str, files: set[str]) -> str | None:
    """For a folder without a manifest: None when it holds no HDF5 file, "" when the file is
    packer's own (an unfinished conversion), else what it is."""
    if DATA_FILE not in files:
        return None
    try:
        import h5py

        with h5py.File(os.path.join(directory, DATA_FILE), "r") as f:
            if "packer_layout" in f.attrs:
                return ""
    except Exception:  # noqa: BLE001 - unreadable: not ours to describe further
        pass
    return "an HDF5 file not written by packer"
