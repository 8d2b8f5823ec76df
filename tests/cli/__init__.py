"""Tests of packer/cli/: the command line, called as packer.cli.main([...])."""
