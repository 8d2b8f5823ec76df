"""Tests of each format's writer, layout and reader, the format registry and the one contract."""
