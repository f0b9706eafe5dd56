"""Wrong call inputs shared by the `test_bad_*` tests of the layers: each must raise a
`ValueError` naming the argument, the same on every backend."""

import numpy as np
import pytest


def bad_padding_masks(batch, length):
    """Padding masks that do not match inputs `[batch, length, ...]`: wrong rank, length or
    batch (a batch or length of 1 would broadcast silently if it were not checked)."""
    return [
        pytest.param(np.ones((batch, length, 1), bool), id="rank3"),
        pytest.param(np.ones((length,), bool), id="rank1"),
        pytest.param(np.ones((batch, length + 1), bool), id="longer"),
        pytest.param(np.ones((batch, 1), bool), id="length1"),
        pytest.param(np.ones((batch + 1, length), bool), id="batch"),
        pytest.param(np.ones((1, length), bool), id="batch1"),
    ]


def raises_naming(name, call):
    """Runs `call` and requires a `ValueError` whose message names the argument `name`."""
    with pytest.raises(ValueError) as error:
        call()
    assert f"{name}" in str(error.value), str(error.value)
    return str(error.value)
