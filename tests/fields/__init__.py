"""Tests of packer/fields/: masks, extra images and boxes, in every format, source and reader."""
