"""Tests of packer/pipeline/: the one conversion pipeline (engine, items, scan, order)."""
