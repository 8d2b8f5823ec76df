"""The benchmarks of docs/benchmarks.md, one module per section (``common`` holds what they share);
run them as ``python -m tools.bench_parts SUBCOMMAND``."""
