"""Old path of :mod:`packer.pipeline.items`, kept for users who import it here."""

from packer.pipeline.items import *  # noqa: F403
from packer.pipeline.items import __all__  # noqa: F401
