"""Tests of packer/storage/: object storage (S3, GCS) and the node's download cache."""
