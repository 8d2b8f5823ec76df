"""Crop windows of NumPy integers are ints; a window of other types is a TypeError naming the sample."""

from __future__ import annotations

import pytest


# -- crop windows of NumPy integers ------------------------------------------------------------------
class _NumpyWindow:
    """A custom crop whose window is NumPy uint8 scalars (a sum of two wraps at 256)."""

    def window(self, height: int, width: int):
        import numpy as np

        return tuple(np.uint8(v) for v in (200, 3, 100, 50))


def test_numpy_integer_windows_are_ints_and_other_types_are_refused():
    import cv2
    import numpy as np

    from packer.datasets.crops import as_crop
    from packer.images.imageproc import crop_window, decode_payload, decode_payload_window
    from tests.helpers import draw

    rgb = draw(np.random.default_rng(3), 320, 90)
    want = rgb[200:300, 3:53]
    np.testing.assert_array_equal(crop_window(rgb, _NumpyWindow().window), want)  # was an empty 0 x 50 image
    payload = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()
    np.testing.assert_array_equal(decode_payload_window(payload, "jpeg", 320, 90, _NumpyWindow().window),
                                  decode_payload(payload, "jpeg")[200:300, 3:53])
    for bad in ((0.0, 0, 5, 5), (0, 0, True, 5), (0, 0, 5), None):
        with pytest.raises(TypeError, match=r"sample 2 of /d: a crop window must be four integers"):
            crop_window(rgb, lambda h, w, bad=bad: bad, path="/d", sample=2)
    assert as_crop(np.uint8(20)).window(64, 64) == (22, 22, 20, 20)
