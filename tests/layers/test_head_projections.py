"""`head_projections.project`: one matmul over the flattened heads, equal to the `EinsumDense`
call it replaces, in `MultiHeadAttention` and `LinearAttention` alike."""

import keras
import numpy as np
import pytest

from keras_xf.layers import LinearAttention
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers.head_projections import INTO_HEADS
from keras_xf.layers.head_projections import OUT_OF_HEADS
from keras_xf.layers.head_projections import head_projection
from keras_xf.layers.head_projections import project


@pytest.mark.parametrize("use_bias", [False, True])
def test_project_equals_the_einsum(use_bias):
    rng = np.random.default_rng(0)
    into = head_projection("into", INTO_HEADS, (None, 3, 4), "hk", use_bias=use_bias,
                           kernel_initializer="glorot_uniform", bias_initializer="ones",
                           dtype="float32")
    out = head_projection("out", OUT_OF_HEADS, (None, 8), "d", use_bias=use_bias,
                          kernel_initializer="glorot_uniform", bias_initializer="ones",
                          dtype="float32")
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    heads = rng.normal(size=(2, 5, 3, 4)).astype("float32")
    into.build(x.shape)
    out.build(heads.shape)
    for dense, inputs in ((into, x), (out, heads)):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(project(dense, inputs)),
            keras.ops.convert_to_numpy(dense(inputs)),
            rtol=1e-5, atol=1e-5,
        )


def test_attention_and_linear_attention_share_the_projections():
    for layer in (MultiHeadAttention(2), LinearAttention(2)):
        layer(np.zeros((1, 3, 8), "float32"))
        assert layer.query_dense.equation == INTO_HEADS
        assert layer.output_dense.equation == OUT_OF_HEADS
