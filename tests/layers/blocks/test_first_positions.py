"""`output_length`: a stack or block that returns the first positions only, its last layer
computing queries, residuals, norms and feedforward for those rows alone (a `[CLS]` pooling)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RelativePositionBias
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests.layer_checks import to_numpy
from tests.layers.bad_inputs import raises_naming

WIDTH, HEADS, HIDDEN = 8, 2, 16
BATCH, LENGTH = 2, 6
TOLERANCE = dict(atol=2e-6, rtol=2e-6)


def block(norm_placement="pre", mixer=None):
    return TransformerBlock(mixer or MultiHeadAttention(HEADS), FeedForward(HIDDEN),
                            norm_placement=norm_placement)


def inputs_and_mask(rng):
    x = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    return x, np.arange(LENGTH)[None] < np.array([[LENGTH], [3]])


def query_lengths(mixer):
    """Records the query length of each call of `mixer`."""
    lengths, call = [], mixer.call

    def spy(query, *args, **kwargs):
        lengths.append(query.shape[1])
        return call(query, *args, **kwargs)

    object.__setattr__(mixer, "call", spy)
    return lengths


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("rows", [1, 4])
def test_stack_first_rows_equal_the_full_stack(rng, norm_placement, rows):
    stack = TransformerStack(block(norm_placement), 3)
    x, mask = inputs_and_mask(rng)
    full = to_numpy(stack(x, padding_mask=mask))
    last = query_lengths(stack.blocks[-1].mixer)
    first = query_lengths(stack.blocks[0].mixer)
    got = to_numpy(stack(x, padding_mask=mask, output_length=rows))
    assert got.shape == (BATCH, rows, WIDTH)
    np.testing.assert_allclose(got, full[:, :rows], **TOLERANCE)
    # The last layer's queries are the first rows; the others see every position.
    assert last == [rows] and first == [LENGTH]


def test_attention_mask_and_causal_mask_keep_their_first_rows(rng):
    stack = TransformerStack(block(), 2)
    x, mask = inputs_and_mask(rng)
    pairs = rng.random((BATCH, LENGTH, LENGTH)) < 0.7
    pairs |= np.eye(LENGTH, dtype=bool)[None]
    for kwargs in ({"attention_mask": pairs}, {"use_causal_mask": True, "padding_mask": mask}):
        full = to_numpy(stack(x, **kwargs))
        got = to_numpy(stack(x, output_length=2, **kwargs))
        np.testing.assert_allclose(got, full[:, :2], **TOLERANCE)


@pytest.mark.parametrize("case", ["other_mixer", "shared_maps", "shared_biases"])
def test_stacks_whose_last_layer_needs_every_row_slice_the_full_outputs(rng, case):
    if case == "other_mixer":
        stack = TransformerStack([block(), block(mixer=AverageAttention())], 2)
        assert not stack.blocks[-1].computes_first_positions
    elif case == "shared_maps":
        stack = TransformerStack(block(), 2, share_attention_maps=2)
    else:
        template = block(mixer=MultiHeadAttention(HEADS, biases=[RelativePositionBias(8)]))
        stack = TransformerStack(template, 2, share_score_biases=True)
    x, mask = inputs_and_mask(rng)
    full = to_numpy(stack(x, padding_mask=mask))
    got = to_numpy(stack(x, padding_mask=mask, output_length=1))
    np.testing.assert_allclose(got, full[:, :1], **TOLERANCE)


def test_block_computes_first_positions_for_plain_self_attention_only(rng):
    attention = block()
    assert attention.computes_first_positions
    x, mask = inputs_and_mask(rng)
    full = to_numpy(attention(x, padding_mask=mask))
    np.testing.assert_allclose(to_numpy(attention(x, padding_mask=mask, output_length=2)),
                               full[:, :2], **TOLERANCE)
    averaging = block(mixer=AverageAttention())
    assert not averaging.computes_first_positions
    full = to_numpy(averaging(x, padding_mask=mask))
    np.testing.assert_allclose(to_numpy(averaging(x, padding_mask=mask, output_length=2)),
                               full[:, :2], **TOLERANCE)


def test_symbolic_and_compiled_calls(rng):
    stack = TransformerStack(block(), 2)
    inputs = keras.Input((None, WIDTH))
    mask = keras.Input((None,), dtype="bool")
    outputs = stack(inputs, padding_mask=mask, output_length=1)
    assert tuple(outputs.shape) == (None, 1, WIDTH)
    model = keras.Model([inputs, mask], outputs)
    x, padding = inputs_and_mask(rng)
    full = to_numpy(stack(x, padding_mask=padding))
    np.testing.assert_allclose(model.predict([x, padding], verbose=0), full[:, :1], **TOLERANCE)


@pytest.mark.parametrize("value", [0, LENGTH + 1, 1.5, True])
def test_bad_output_length_is_named(rng, value):
    stack = TransformerStack(block(), 2)
    x, _ = inputs_and_mask(rng)
    message = raises_naming("output_length", lambda: stack(x, output_length=value))
    assert "Received: output_length=" in message
