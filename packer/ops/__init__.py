"""Old import paths kept for users: ``packer.ops.engine``, ``packer.ops.items`` and
``packer.ops.merge`` forward to :mod:`packer.pipeline` and :mod:`packer.operations` (also
``packer.ConvertOptions``, ``packer.convert_items``, ``packer.merge``)."""
