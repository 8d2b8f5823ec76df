"""Files: local and fsspec file systems, bounded reads of source files, journals of work in progress."""
