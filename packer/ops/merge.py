"""Old path of :mod:`packer.operations.merge`, kept for users who import it here."""

from packer.operations.merge import *  # noqa: F403
from packer.operations.merge import __all__  # noqa: F401
