"""packer.checks.check_int: the one integer argument check."""

from __future__ import annotations

import numpy as np
import pytest

from packer.checks import check_int


def test_accepts_integers_and_returns_plain_ints() -> None:
    assert check_int("n", 3, 0) == 3
    value = check_int("n", np.int64(5), 0, 6)
    assert value == 5 and type(value) is int
    assert check_int("n", -7, None) == -7


@pytest.mark.parametrize(
    ("value", "low", "high", "error", "match"),
    [
        (True, 0, None, TypeError, "^n must be an integer, got bool True$"),
        (1.0, 0, None, TypeError, "^n must be an integer, got float 1.0$"),
        ("1", 0, None, TypeError, "^n must be an integer, got str '1'$"),
        (-1, 0, None, ValueError, "^n must be >= 0, got -1$"),
        (4, 0, 4, ValueError, r"^n must be in \[0, 4\), got 4$"),
    ],
)
def test_refuses_with_one_line_naming_the_parameter(value: object, low: int, high: int | None,
                                                    error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_int("n", value, low, high)
