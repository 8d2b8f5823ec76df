"""Old path of :mod:`packer.pipeline.engine`, kept for users who import it here."""

from packer.pipeline.engine import *  # noqa: F403
from packer.pipeline.engine import __all__  # noqa: F401
