"""The HDF5 layout: one file, ``data.h5``.

The one home of the format's on-disk knowledge: the writer (packer.converters.hdf5), the reader
(packer.datasets.hdf5) and the tests import it.

Layout (``packer_layout`` 2, 1 in version 1 datasets; docs/FORMATS.md repeats it for people reading with only ``h5py``)::

    /images    storage "flat":  uint8 (total payload bytes,), chunks (1 MiB,), unlimited;
                                sample i is images[offsets[i]:offsets[i+1]] (encoded bytes, or raw
                                H x W x 3 RGB bytes when raw images differ in size)
               storage "array": uint8 (N, H, W, 3) RGB, chunks (k, H, W, 3) with
                                k = max(1, 1 MiB // (H*W*3)); used when every sample is raw and of
                                one shape (encoding raw with resize WxH, or a source of one size)
    /offsets   uint64 (N+1,)   "flat" only: byte offsets of the samples in /images
    /labels    int64 (N,)
    /shapes    uint32 (N, 2)   stored height, width
    /crc32c    uint32 (N,)     CRC32C (Castagnoli) of each sample's payload bytes, seeded with its
                               place (packer.placement; version 1: not seeded)
    /keys      UTF-8 variable-length strings (N,): source path relative to the source root (an
               HDF5 string cannot hold NUL: NUL and unencodable characters become U+FFFD)
    /key_crc32c uint32 (N,)    CRC32C of each key's UTF-8 bytes (keys live in HDF5's global heap,
               which has no checksum of its own)
    /codecs    uint8 (N,)      only when the root attribute codec is "mixed" (ids of packer.record)
    /classes   UTF-8 variable-length strings (C,): class names in label order

    root attributes: packer_layout, file_id (version 2), storage, codec (one name, or "mixed"), num_samples,
                     chunk_bytes, manifest (JSON, see below)
    /labels, /offsets, /shapes, /crc32c, /key_crc32c, /codecs carry attribute crc32c: the CRC32C
    of the dataset's little-endian bytes, checked by the reader when it opens the file.

Why a flat byte array plus offsets instead of a variable-length uint8 dataset: h5py reads one
vlen element markedly slower than one slice of a flat dataset (docs/benchmarks.md, section 5).
Flat storage also lets the reader skip h5py on the hot path: unfiltered chunks are plain bytes in
the file, so it maps each chunk to its file address once and reads a sample with one
``os.pread``.
Any h5py user still reads a sample with one slice. No compression filter is set: payloads are
already compressed, and a filter would force every read through HDF5.

What a reader accepts: every per-sample dataset has exactly the manifest's rows, and those rows
and the ``/images`` bytes the samples need are stored in the file (all chunks written; under a
compression filter, at most 1,100 times their stored size), so a file that only declares rows
is refused before anything is allocated for them. ``/images`` chunks under 64 kB are read
through h5py rather than by file address.

The ``manifest`` attribute holds the manifest facts that exist while this file is written
(version, format, created_by, num_samples, classes, processing, shuffle_seed, source, layout); the
per-file SHA-256, the skip list and ignored counts exist only after the file is finished, so they
live in manifest.json alone, which stays the authority.
"""

import os

__all__ = ["DATA_FILE", "LAYOUT_VERSION", "LAYOUT_VERSIONS", "CHUNK_BYTES", "LIBVER", "identify"]

DATA_FILE = "data.h5"
LAYOUT_VERSION = 2  # 2: /crc32c seeded with each sample's place (packer.placement); the file_id attribute
LAYOUT_VERSIONS = (1, 2)  # readable
CHUNK_BYTES = 1 << 20  # payload chunk size
LIBVER = ("earliest", "v110")  # pinned file format: identical input gives identical bytes


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
