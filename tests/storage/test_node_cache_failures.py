"""The node cache's own failures (disk full, read-only, symlinks) are one line naming the file and the URL."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.formats.test_hostile import small_fs  # noqa: F401  (fixtures: a 24-image source, a 2 MB tmpfs)


# -- the node cache's own failures name the file and the URL --------------------------------------
def test_node_cache_disk_full_read_only_and_symlinks_are_one_line_naming_file_and_url(tmp_path, small_fs):  # noqa: F811
    """Were raw OSErrors naming neither the cache file nor the URL (and the ENOSPC download file
    stayed open, keeping the file system busy)."""
    import errno
    import hashlib

    from packer.storage.nodecache import NodeCache, NodeCacheError

    data = os.urandom(3 << 20)
    src = str(tmp_path / "shard.bin")
    with open(src, "wb") as f:
        f.write(data)
    sha, url = hashlib.sha256(data).hexdigest(), "s3://bucket/ds/shard-000000.tar"
    cache = NodeCache(small_fs)
    view = cache.view("s3://bucket/ds", b"{}")
    with pytest.raises(NodeCacheError, match=r"^node cache: disk full \(no space left on device\): "
                       rf"{view}/shard-000000\.tar while caching {url}; free space there or lower cache_limit$") as e:
        cache.fetch(os.path.join(view, "shard-000000.tar"), len(data), sha, lambda: open(src, "rb"), url)
    assert e.value.errno == errno.ENOSPC and not [n for n in os.listdir(view) if n.endswith(".partial")]
    subprocess.run(["mount", "-o", "remount,ro", small_fs], check=True)
    with pytest.raises(NodeCacheError, match=r"^node cache: read-only file system: .* while caching s3://bucket/b; "
                                             r"set cache_dir \(or PACKER_CACHE_DIR\) to a writable folder$"):
        NodeCache(small_fs).view("s3://bucket/b", b"{}")
    cache = NodeCache(str(tmp_path / "cache"))
    view = cache.view("s3://bucket/ds", b"{}")
    planted = os.path.join(view, "shard-000000.tar")
    os.symlink(src, planted)  # planted where a cached file belongs: removed, never followed
    before = os.stat(src)
    fd = cache.fetch(planted, len(data), sha, lambda: open(src, "rb"), url)
    os.close(fd)
    assert not os.path.islink(planted) and open(planted, "rb").read() == data
    assert (os.stat(src).st_mtime_ns, os.stat(src).st_size) == (before.st_mtime_ns, before.st_size)
