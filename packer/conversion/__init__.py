"""A conversion, Python first, above the sources: the options table and the typed request
(options), the one function that checks keywords or flags into a request (request), running a
request (run: URLs, the source's converter) and converting in parts under torchrun (distributed).
The front ends, :mod:`packer.api` and :mod:`packer.cli`, sit on it."""

from __future__ import annotations

__all__: list[str] = []
