"""The operations, above the core (packer/*.py) and the formats (packer/layouts, packer.converters,
packer.datasets): conversion (engine, transcode), verify, the CLI, the demo and the loader
benchmark. The core never imports them."""
