"""Tests of packer/operations/: merge, transcode, preview, bench and doctor."""
