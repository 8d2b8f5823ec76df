"""One module per format holding all of its on-disk knowledge: file names, structs, index
pack/unpack, member scans and damage locators. The writer (packer.converters), the reader
(packer.datasets), ``verify`` and the tests import these; readers never import writers.
docs/FORMATS.md is the user's reference for the same layouts."""
