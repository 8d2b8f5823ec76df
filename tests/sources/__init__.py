"""Tests of packer/sources/: lists and other tools' datasets."""
