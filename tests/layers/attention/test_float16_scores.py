"""Attention scores are formed in float32 on every path: under `mixed_float16` each
`MultiHeadAttention` variant stays finite on inputs ×1e3 (a float16 `q·kᵀ` overflows from about
×300), and rows whose keys are all masked give zeros in float32, float16 and bfloat16."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import CompressedAttention
from keras_xf.layers import LocalityPrior
from keras_xf.layers import LocalPattern
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RelativePositionBias
from keras_xf.layers import RelativePositionEmbedding
from keras_xf.layers import RotaryEmbedding
from keras_xf.ops.attention import scaled_dot_product_attention

B, T, D, H = 2, 6, 16, 4

VARIANTS = {
    "plain": lambda: MultiHeadAttention(H),
    "gqa": lambda: MultiHeadAttention(H, num_key_value_heads=2),
    "mqa": lambda: MultiHeadAttention(H, num_key_value_heads=1),
    "qk_dim": lambda: MultiHeadAttention(H, qk_dim=2),
    "rotary": lambda: MultiHeadAttention(H, position=RotaryEmbedding()),
    "alibi": lambda: MultiHeadAttention(H, biases=[AlibiBias()]),
    "relative_bias": lambda: MultiHeadAttention(
        H, biases=[RelativePositionBias(num_buckets=4, max_distance=8)]),
    "relative_embedding": lambda: MultiHeadAttention(
        H, biases=[RelativePositionEmbedding(2, use_values=True, use_queries=True)]),
    "locality_prior": lambda: MultiHeadAttention(H, biases=[LocalityPrior()]),
    "locality_mixture": lambda: MultiHeadAttention(
        H, biases=[LocalityPrior(form="mixture", beta="gated", distance="predicted")]),
    "multiplier": lambda: MultiHeadAttention(H, multiplier=LocalityPrior(form="multiplicative")),
    "local_pattern": lambda: MultiHeadAttention(H, pattern=LocalPattern(2), causal=True),
    "compressed": lambda: CompressedAttention(H, compressed_length=3, max_length=T),
    "selection": lambda: CompressedAttention(H, compressed_length=3, method="selection"),
}


def _parts(result):
    """`(outputs, attention_scores or None)` of a dict or tuple result."""
    if isinstance(result, dict):
        return result["outputs"], result.get("attention_scores")
    if isinstance(result, (tuple, list)):
        return result[0], result[1] if len(result) > 1 else None
    return result, None


def _np(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def _large(scale=1e3, length=T):
    return np.random.default_rng(0).normal(size=(B, length, D)).astype("float32") * scale


def _assert_finite(*tensors):
    for tensor in tensors:
        if tensor is not None:
            assert np.isfinite(_np(tensor)).all()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_float16_scores_stay_finite(variant):
    keras.config.set_dtype_policy("mixed_float16")
    layer = VARIANTS[variant]()
    x = _large()
    _assert_finite(layer(x))
    _assert_finite(*_parts(layer(x, return_attention_scores=True)))
    # Given attention weights and a syntax multiplier/bias take the explicit path too.
    if isinstance(layer, CompressedAttention):
        return
    m = np.ones((B, T, T), "float32")
    _assert_finite(layer(x, attention_multiplier=m, attention_bias=m))


def test_the_float16_overflow_is_real():
    """The inputs of these tests overflow a float16 `q·kᵀ`: the premise of the fix."""
    keras.config.set_dtype_policy("mixed_float16")
    layer = MultiHeadAttention(H)
    layer(_large())
    q = keras.ops.cast(layer.query_dense(_large()), "float16")
    products = keras.ops.einsum("bthd,bshd->bhts", q, q)
    assert not np.isfinite(_np(products)).all()


@pytest.mark.parametrize("variant", ["plain", "gqa", "rotary", "relative_embedding"])
def test_mixed_float16_given_weights_cross_attention_and_decoding(variant):
    keras.config.set_dtype_policy("mixed_float16")
    layer = VARIANTS[variant]()
    x = _large()
    weights = np.full((B, H, T, T), 1.0 / T, "float32")
    _assert_finite(layer(x, attention_weights=weights))
    _assert_finite(layer(x, _large(length=T - 1)))  # cross-attention
    cache = layer.init_cache(B, T)
    full = _parts(layer(x, use_causal_mask=True))[0]
    steps = []
    for index in range(T):
        outputs, cache = layer(x[:, index : index + 1], cache=cache, cache_index=index,
                               use_causal_mask=True)
        steps.append(_np(outputs))
    steps = np.concatenate(steps, axis=1)
    assert np.isfinite(steps).all()
    np.testing.assert_allclose(steps, _np(full), rtol=0.05, atol=0.05 * np.abs(steps).max())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["plain", "gqa", "alibi", "multiplier", "local_pattern"])
def test_fully_masked_rows_give_zeros(variant, dtype):
    keras.config.set_dtype_policy(dtype)
    layer = VARIANTS[variant]()
    x = _large(scale=10.0)
    padding_mask = np.ones((B, T), bool)
    padding_mask[1] = False  # the second sequence has no real key
    for result in (layer(x, padding_mask=padding_mask),
                   layer(x, padding_mask=padding_mask, return_attention_scores=True)):
        outputs, weights = _parts(result)
        outputs = _np(outputs)
        assert np.isfinite(outputs).all()
        np.testing.assert_array_equal(outputs[1], 0.0)  # α = 0, zero output bias
        if weights is not None:
            np.testing.assert_array_equal(_np(weights)[1], 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_dot_product_attention_fully_masked_rows(dtype, with_bias):
    rng = np.random.default_rng(0)
    q = keras.ops.convert_to_tensor(rng.normal(size=(B, T, H, 4)) * 300, dtype)
    mask = np.ones((B, 1, T, T), bool)
    mask[:, :, 2] = False  # query 2 attends to nothing
    bias = keras.ops.convert_to_tensor(np.zeros((1, H, T, T)), dtype) if with_bias else None
    for return_weights in (False, True):
        result = scaled_dot_product_attention(q, q, q, mask=mask, bias=bias,
                                              return_weights=return_weights)
        outputs = _np(result[0] if return_weights else result)
        assert np.isfinite(outputs).all()
        np.testing.assert_array_equal(outputs[:, 2], 0.0)
