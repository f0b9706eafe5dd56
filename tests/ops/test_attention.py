import keras
import numpy as np
import pytest

from keras_xf import ops as xops
from tests.layer_checks import to_numpy
from tests.reference import attention as ref

# The worked example of survey §2.6: scores of a 4-token decoder and the causal mask.
SURVEY_SCORES = np.array(
    [[2, 0.1, 1, 1], [0, 0.9, 0.9, 0.9], [0.2, 0.8, 0.7, 2], [0.3, 1, 0.3, 3]], "float32"
)
SURVEY_WEIGHTS = np.array(
    [[1, 0, 0, 0], [0.3, 0.7, 0, 0], [0.2, 0.4, 0.4, 0], [0.05, 0.1, 0.05, 0.8]], "float32"
)


def test_masked_softmax_reproduces_the_survey_example():
    weights = to_numpy(xops.masked_softmax(SURVEY_SCORES, xops.causal_mask(4)))
    # The survey rounds to one significant digit.
    np.testing.assert_allclose(weights, SURVEY_WEIGHTS, atol=0.06)
    np.testing.assert_allclose(weights, ref.softmax_with_mask(SURVEY_SCORES, np.tril(np.ones((4, 4), bool))), rtol=1e-6)
    assert np.all(weights[np.triu_indices(4, 1)] == 0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_masked_softmax_is_float32_and_fully_masked_rows_are_zero(dtype):
    scores = keras.ops.cast(np.random.default_rng(0).normal(size=(2, 3, 4)) * 100, dtype)
    mask = np.ones((2, 3, 4), bool)
    mask[0, 1] = False
    weights = xops.masked_softmax(scores, mask)
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    weights = to_numpy(weights)
    assert np.all(np.isfinite(weights))
    np.testing.assert_array_equal(weights[0, 1], 0.0)
    np.testing.assert_allclose(weights.sum(-1)[mask.any(-1)], 1.0, rtol=1e-5)


def test_masked_softmax_above_rank_five_matches_reference(rng):
    """Rank-6 scores (the block-sparse layout) take the written-out softmax: TensorFlow's
    oneDNN CPU kernel refuses more than 5 dims."""
    scores = rng.normal(size=(2, 1, 2, 1, 3, 4)).astype("float32") * 10
    mask = rng.random(scores.shape) > 0.3
    mask[0, 0, 1, 0, 2] = False  # one fully masked row
    weights = to_numpy(xops.masked_softmax(scores, mask))
    np.testing.assert_allclose(weights, ref.softmax_with_mask(scores, mask), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_array_equal(weights[0, 0, 1, 0, 2], 0.0)
    unmasked = to_numpy(xops.masked_softmax(scores))
    np.testing.assert_allclose(unmasked, ref.softmax_with_mask(scores), rtol=1e-5, atol=1e-7)


def _random_qkv(rng, batch=2, tq=5, tk=6, heads=4, kv_heads=2, dim=8):
    q = rng.normal(size=(batch, tq, heads, dim)).astype("float32")
    k = rng.normal(size=(batch, tk, kv_heads, dim)).astype("float32")
    v = rng.normal(size=(batch, tk, kv_heads, dim)).astype("float32")
    return q, k, v


def _reference(q, k, v, mask=None, bias=None):
    group = q.shape[2] // k.shape[2]
    qh, kh, vh = (np.transpose(x, (0, 2, 1, 3)).astype("float64") for x in (q, k, v))
    kh, vh = np.repeat(kh, group, 1), np.repeat(vh, group, 1)
    out, weights = ref.qkv_attention(qh, kh, vh, mask=mask, bias=bias)
    return np.transpose(out, (0, 2, 1, 3)), weights


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_attention_matches_reference_for_mha_gqa_mqa(rng, kv_heads):
    q, k, v = _random_qkv(rng, kv_heads=kv_heads)
    mask = rng.random((2, 1, 5, 6)) > 0.3
    bias = rng.normal(size=(1, 4, 5, 6)).astype("float32")
    expected, expected_weights = _reference(q, k, v, mask, bias)
    fused = xops.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    explicit, weights = xops.scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, return_weights=True
    )
    np.testing.assert_allclose(to_numpy(fused), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(explicit), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=1e-6)


def test_causal_flag_equals_explicit_causal_mask(rng):
    q, k, v = _random_qkv(rng, tq=5, tk=5)
    expected, _ = _reference(q, k, v, mask=ref.causal_mask(5))
    for return_weights in (False, True):
        out = xops.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=return_weights)
        out = out[0] if return_weights else out
        np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fused_and_explicit_paths_agree_on_fully_masked_rows(rng, dtype):
    q, k, v = (keras.ops.cast(x, dtype) for x in _random_qkv(rng))
    mask = np.ones((2, 1, 5, 6), bool)
    mask[0] = False  # the whole first sequence is padding
    mask[1, :, 2] = False  # one query row with no key
    fused = to_numpy(keras.ops.cast(xops.scaled_dot_product_attention(q, k, v, mask=mask), "float32"))
    explicit, _ = xops.scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    explicit = to_numpy(keras.ops.cast(explicit, "float32"))
    assert np.all(np.isfinite(fused)) and np.all(np.isfinite(explicit))
    np.testing.assert_array_equal(fused[0], 0.0)
    np.testing.assert_array_equal(fused[1, 2], 0.0)
    tolerance = 1e-5 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(fused, explicit, atol=tolerance)


@pytest.fixture
def restore_flash_switch():
    """Keras's global flash switch, restored after the test."""
    from keras.src.backend.common import global_state

    previous = keras.config.is_flash_attention_enabled()
    yield
    global_state.set_global_attribute("flash_attention", previous)


@pytest.mark.parametrize("switch", ["enable", "disable"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_attention_follows_the_keras_flash_switch(rng, restore_flash_switch, switch, dtype,
                                                        monkeypatch):
    getattr(keras.config, f"{switch}_flash_attention")()
    asked = []
    if keras.config.backend() == "jax":
        # Keras's JAX kernel asks whether flash applies only when the switch leaves it the choice.
        from keras.src.backend.jax import nn as jax_nn

        original = jax_nn._can_use_flash_attention
        monkeypatch.setattr(jax_nn, "_can_use_flash_attention",
                            lambda *a, **k: asked.append(1) or original(*a, **k))
    q, k, v = (keras.ops.cast(x, dtype) for x in _random_qkv(rng, kv_heads=2))
    mask = rng.random((2, 1, 5, 6)) > 0.3
    mask[0, 0, 1] = False
    expected, _ = _reference(*(to_numpy(keras.ops.cast(x, "float32")) for x in (q, k, v)), mask)
    expected[0, 1] = 0.0
    # Where the platform has no flash kernel (a CPU) the switch falls back; it never raises.
    out = xops.scaled_dot_product_attention(q, k, v, mask=mask)
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(to_numpy(keras.ops.cast(out, "float32")), expected, atol=tolerance)
    if keras.config.backend() == "jax":
        assert bool(asked) == (switch == "enable")


def test_fully_masked_rows_with_bias_and_mask_are_zero(rng):
    q, k, v = _random_qkv(rng)
    mask = np.zeros((2, 1, 5, 6), bool)
    bias = rng.normal(size=(1, 4, 5, 6)).astype("float32")
    out = to_numpy(xops.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias))
    np.testing.assert_array_equal(out, 0.0)


def test_dropout_only_in_training(rng):
    q, k, v = _random_qkv(rng)
    seed = keras.random.SeedGenerator(1)
    base = to_numpy(xops.scaled_dot_product_attention(q, k, v))
    same = to_numpy(xops.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, training=False))
    dropped = to_numpy(
        xops.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, training=True, seed_generator=seed)
    )
    np.testing.assert_allclose(same, base, atol=1e-6)
    assert not np.allclose(dropped, base, atol=1e-3)


def test_bad_arguments_raise():
    q = np.zeros((1, 2, 3, 4), "float32")
    k = np.zeros((1, 2, 2, 4), "float32")
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        xops.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="dropout_rate=-0.1"):
        xops.scaled_dot_product_attention(q, q, q, dropout_rate=-0.1)
