"""Tests of packer/conversion/: options, runs, resume, faults and torchrun."""
