"""Tests of packer.datasets.shm: shared memory, the RAM cache, worker memory."""
