"""The one table of image codecs a packed sample can have. Adding a codec is one row here plus its
encoder in packer.images.imageproc; every other codec lookup in packer is derived from this table."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Codec", "CODEC_TABLE", "CODEC_IDS", "CODEC_NAMES", "TAR_EXTENSIONS", "MEMBER_CODECS",
           "FILE_EXTENSIONS", "TF_FORMAT_CODECS"]


@dataclass(frozen=True)
class Codec:
    """One codec: its name, its id on disk (never reused), the tar member extension packer writes,
    the file extensions that hold it (the first is used when a file is renamed), the extra member
    extensions other tools use for it in tar shards, and the ``image/format`` tokens of TFRecord
    Examples that mean it."""

    name: str
    id: int
    tar_extension: str
    file_extensions: tuple[str, ...]
    member_extensions: tuple[str, ...] = ()
    tf_formats: tuple[bytes, ...] = ()


#: In order of preference when a foreign tar sample has several image members.
CODEC_TABLE: tuple[Codec, ...] = (
    Codec("jpeg", 1, "jpg", (".jpg", ".jpeg", ".jpe"), ("jpeg",), (b"jpeg", b"jpg", b"JPEG")),
    Codec("png", 2, "png", (".png",), (), (b"png", b"PNG")),
    Codec("webp", 3, "webp", (".webp",), (), (b"webp",)),
    Codec("raw", 0, "npy", (), (), (b"raw",)),
    Codec("bmp", 4, "bmp", (".bmp",), (), (b"bmp",)),
    Codec("tiff", 5, "tiff", (".tif", ".tiff"), ("tif",), (b"tiff",)),
    Codec("pnm", 6, "ppm", (".ppm", ".pgm", ".pbm", ".pnm"), ("pgm", "pnm"), (b"pnm",)),
    Codec("gif", 7, "gif", (".gif",), (), (b"gif",)),
)

#: name -> id on disk (LMDB records, HDF5 /codecs, tar index entries).
CODEC_IDS: dict[str, int] = {c.name: c.id for c in CODEC_TABLE}
#: id on disk -> name.
CODEC_NAMES: dict[int, str] = {c.id: c.name for c in CODEC_TABLE}
#: name -> the tar member extension packer writes.
TAR_EXTENSIONS: dict[str, str] = {c.name: c.tar_extension for c in CODEC_TABLE}
#: tar member extension -> name, for shards written by other tools (in order of preference).
MEMBER_CODECS: dict[str, str] = {
    ext: c.name for c in CODEC_TABLE for ext in (c.tar_extension, *c.member_extensions)
}
#: name -> file extensions (with the dot, lower case).
FILE_EXTENSIONS: dict[str, tuple[str, ...]] = {c.name: c.file_extensions for c in CODEC_TABLE if c.file_extensions}
#: TFRecord ``image/format`` token -> name.
TF_FORMAT_CODECS: dict[bytes, str] = {tok: c.name for c in CODEC_TABLE for tok in c.tf_formats}
