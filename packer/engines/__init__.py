"""Conversions run by cluster engines: Ray Data (:mod:`packer.engines.ray`, ``packer.ray``) and
Spark (:mod:`packer.engines.spark`, ``packer.spark``), each task making a part that the driver
merges (:mod:`packer.engines.parts`)."""
