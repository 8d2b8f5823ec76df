"""Benchmarks and fault-injection tools, run from the repository root as ``python -m tools.<name>``
or ``python tools/<name>.py``."""
