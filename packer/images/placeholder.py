"""Payload files that are not the data: a git-LFS pointer checked out instead of the shard, or an
HTML error page saved by a failed download. Readers call :func:`placeholder_reason` when a file
cannot be parsed, so the error says what the file really is, in the wording of
:func:`packer.images.imageheader.describe_non_image`."""

from __future__ import annotations

from .imageheader import describe_non_image

__all__ = ["placeholder_reason", "file_placeholder_reason"]


def placeholder_reason(head: bytes) -> str | None:
    """What the first bytes of a file say it is, when it is a git-LFS pointer, an HTML/XML page or
    empty; None for anything else."""
    if not head:
        return "an empty file (0 bytes)"
    text = head[:64].lstrip().lower()
    if text.startswith((b"version https://git-lfs", b"<!doctype html", b"<html", b"<?xml")):
        return describe_non_image(head)
    return None


def file_placeholder_reason(path: str) -> str | None:
    """:func:`placeholder_reason` of the file at ``path`` (None when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return placeholder_reason(f.read(256))
    except OSError:
        return None
