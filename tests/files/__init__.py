"""Tests of packer/files/: destinations, claims and full disks."""
