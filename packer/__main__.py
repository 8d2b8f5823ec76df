"""``python -m packer``."""

import sys

from packer.cli import main

if __name__ == "__main__":
    sys.exit(main())
