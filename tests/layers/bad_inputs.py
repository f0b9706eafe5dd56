"""Wrong call inputs shared by the `test_bad_*` tests of the layers: each must raise a
`ValueError` naming the argument, the same on every backend."""

import keras
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


def check_bad_sequence_inputs(make_layer, shape, static_length=False):
    """A layer made by `make_layer()` and built for sequences `shape` `[batch, length, dim]`
    refuses another width and inputs of rank 2 (and, with `static_length`, a symbolic input
    of unknown length), naming `inputs`."""
    batch, length, width = shape
    layer = make_layer()
    layer(np.zeros(shape, "float32"))
    raises_naming("inputs", lambda: layer(np.zeros((batch, length, width + 1), "float32")))
    raises_naming("inputs", lambda: make_layer()(np.zeros((batch, length), "float32")))
    if static_length:
        raises_naming("inputs", lambda: make_layer()(keras.Input((None, width))))


def check_bad_padding_mask(layer, mask, shape):
    """`layer` called on zeros `shape` with a `padding_mask` that does not match them (one of
    `bad_padding_masks`) raises a `ValueError` naming `padding_mask`."""
    inputs = np.zeros(shape, "float32")
    raises_naming("padding_mask", lambda: layer(inputs, padding_mask=mask))
