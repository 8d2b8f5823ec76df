"""The per-format readers, one module a format as the registry (``packer.formats``) lists them,
plus what the sharded ones (tar, tfrecord) share (``shards``). Import them through the registry
or ``packer.datasets``: each is loaded on first use."""
