"""Datasets in places: publishing a dataset folder, object storage and the node cache."""
