"""The storage tests' servers: moto's S3 server on 127.0.0.1, one per test module (``s3``: the
storage_options to reach it), and a proxy in front of it that counts what it answers."""

from __future__ import annotations

import pytest

from tests.helpers import moto_s3
from tools.faultlib import LatencyProxy


@pytest.fixture(scope="module")
def s3():
    with moto_s3("data") as endpoint:
        yield {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint,
                                                                         "region_name": "us-east-1"}}


@pytest.fixture
def proxy(s3):
    """A proxy in front of the server that counts the bytes it answers (``down``) and the requests."""
    p = LatencyProxy(("127.0.0.1", int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])), 0.0)
    yield p
    p.sock.close()
