"""The readers' shared-memory parts, one primitive a module: a region and its views (``region``),
locks and node-named segments (``locks``), the bounded byte cache (``cache``, its memory budget
in ``budget``), the skip counter (``skips``) and worker memory settings (``worker_memory``)."""
