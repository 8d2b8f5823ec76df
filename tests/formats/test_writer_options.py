"""Writer options a format does not take are refused, never silently ignored."""

from __future__ import annotations

import pytest

from packer.cli import main
from packer.description.registry import format_names
from tests.helpers import _src, pack

FORMATS = format_names()


# -- options a format does not take are refused, never silently ignored ------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_writer_options_a_format_does_not_take_are_refused(tmp_path, capsys, fmt):
    from packer.description.registry import get_format

    src = _src(tmp_path)
    takes = get_format(fmt).options
    for flag, field, value in (("--shard-size", "shard_bytes", "1MB"), ("--shard-samples", "shard_samples", "3"),
                               ("--gzip", "gzip", None), ("--checkpoint-samples", "checkpoint_samples", "3")):
        argv = ["convert", "imagefolder", fmt, src, str(tmp_path / f"o-{field}"), "--resize", "none", flag,
                *([value] if value else [])]
        rc = main(argv)
        err = capsys.readouterr().err
        if field in takes:
            assert rc == 0, err
        else:
            assert rc == 2 and f"{flag} applies to" in err and len(err.strip().splitlines()) == 1
            with pytest.raises(ValueError, match=f"{field} does not apply to {fmt}"):
                pack(src, str(tmp_path / "api"), fmt, writer={field: 3 if value else True})
