"""Tests of packer/images/: decoding, processing and encoding images."""
