"""Build step for the one C module, ``packer.images._jpegwindow`` (everything else is in setup.cfg).

The module links the system's libjpeg-turbo (Debian/Ubuntu: ``libjpeg-dev``; Fedora:
``libjpeg-turbo-devel``; conda: ``libjpeg-turbo``) so that readers with ``crop=`` decode only the
crop's window of each JPEG, and shrinks images by ``INTER_AREA`` with OpenCV's arithmetic in
fewer passes (``-ffp-contract=off`` keeps its sums those of OpenCV: no fused multiply-adds). It
is optional: where there is no C compiler or no libjpeg-turbo headers the install goes on without
it and the readers decode whole images, crop them and resize with OpenCV, with the same pixels,
as they do where the module was built against a libjpeg-turbo older than the one its pixels were
checked with (``packer.images.imageproc.WINDOW_DECODER_MINIMUM``).
``PACKER_NO_EXTENSION=1`` skips it on purpose.
"""

import os

from setuptools import Extension, setup

extensions = []
if os.environ.get("PACKER_NO_EXTENSION", "0") != "1":
    extensions.append(Extension("packer.images._jpegwindow", ["packer/images/_jpegwindow.c"], libraries=["jpeg"],
                                extra_compile_args=["-O3", "-ffp-contract=off"], optional=True))

setup(ext_modules=extensions)
