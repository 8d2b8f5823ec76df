"""Tests of packer.datasets: the readers' front door, streaming, partitions, crops and batches."""
