"""Tests of packer/description/: manifests, sample tables, labels and place binding."""
