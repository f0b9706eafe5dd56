"""AverageAttention: the cumulative mean against the numpy loop, cached decoding, padding,
precision, XLA, saving, errors (a CausalLM with it: test_hybrid_stack)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AverageAttention
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.reference import recurrent as ref

B, T, D = 2, 8, 16
LENGTHS = [T, 5]


def _reference(layer, x, causal, mask=None, state=None):
    ffn = gate = None
    if layer.use_ffn:
        ffn = [to_float64(w) for w in (layer.ffn_inner.kernel, layer.ffn_inner.bias,
                                layer.ffn_outer.kernel, layer.ffn_outer.bias)]
    if layer.use_gate:
        gate = (to_float64(layer.gate_dense.kernel), to_float64(layer.gate_dense.bias))
    return ref.average_attention(x, ffn, gate, causal, mask, state)


@pytest.mark.parametrize(
    "config", [dict(), dict(use_ffn=False, use_gate=False), dict(intermediate_dim=24)],
    ids=["ffn-gate", "plain-mean", "wide-ffn"],
)
def test_matches_reference_with_padding(rng, config):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer = AverageAttention(bias_initializer="random_normal", **config)
    for causal in (True, False):
        actual = to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
        expected, _ = _reference(layer, x, causal, mask)
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-4)


def test_fully_padded_rows_give_zeros_not_nan(rng):
    x = random_normal(rng, (B, T, D))
    mask = np.zeros((B, T), bool)
    mask[1, 4:] = True  # row 1 is left-padded, row 0 fully padded
    layer = AverageAttention(bias_initializer="ones")
    for causal in (True, False):
        out = to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out[0], 0.0)
        np.testing.assert_array_equal(out[1, :4], 0.0)
        np.testing.assert_allclose(out, _reference(layer, x, causal, mask)[0], atol=1e-5,
                                   rtol=1e-4)


def test_cached_decoding_equals_full_pass(rng):
    """A prefill of 3 tokens, then one token at a time from `(sum, count)`, equals the full
    causal pass; the final state is the reference's, float32."""
    x = random_normal(rng, (B, T, D))
    layer = AverageAttention(bias_initializer="random_normal")
    full = to_float64(layer(x))
    state = layer.init_cache(B, T)
    outputs, state = layer(x[:, :3], cache=state, cache_index=0)
    pieces = [to_float64(outputs)]
    for t in range(3, T):
        outputs, state = layer(x[:, t:t + 1], cache=state, cache_index=t)
        pieces.append(to_float64(outputs))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)
    expected, (total, count) = _reference(layer, x, causal=True)
    np.testing.assert_allclose(full, expected, atol=1e-5, rtol=1e-4)
    assert [keras.backend.standardize_dtype(s.dtype) for s in state] == ["float32"] * 2
    np.testing.assert_allclose(to_float64(state[0]), total, atol=1e-4, rtol=1e-5)
    np.testing.assert_array_equal(to_float64(state[1]), count)


def test_config_weights_fit_and_saving(rng, tmp_path):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer = AverageAttention(intermediate_dim=24)
    layer.build(x.shape)
    checks.check_config_round_trip(layer)
    ffn = (D * 24 + 24) + (24 * D + D)
    gate = 2 * D * 2 * D + 2 * D
    assert checks.count_params(layer) == ffn + gate
    model = checks.wrap_in_model(AverageAttention(causal=False), [x], {"padding_mask": mask})
    inputs = checks.model_inputs([x], {"padding_mask": mask})
    checks.check_fit_step(model, inputs)
    checks.check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    checks.check_mixed_precision(lambda dtype: AverageAttention(dtype=dtype), [x],
                                 {"padding_mask": mask}, policy=policy)
    layer = AverageAttention(dtype=policy)
    layer.build(x.shape)
    outputs, state = layer(x, cache=layer.init_cache(B, T, "float16"), cache_index=0)
    assert [keras.backend.standardize_dtype(s.dtype) for s in state] == ["float32"] * 2
    reference = AverageAttention()
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_float64(outputs), to_float64(reference(x)), atol=0.05, rtol=0.05)


@checks.xla_only
def test_jit_compile(rng):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    model = checks.wrap_in_model(AverageAttention(), [x], {"padding_mask": mask})
    checks.check_jit_compile(model, checks.model_inputs([x], {"padding_mask": mask}))


def test_bad_configs_and_calls_raise(rng):
    for kwargs, match in [
        (dict(intermediate_dim=0), "intermediate_dim"),
        (dict(use_ffn=False, intermediate_dim=8), "intermediate_dim"),
        (dict(causal="yes"), "causal"),
        (dict(use_gate=None), "use_gate"),
    ]:
        with pytest.raises(ValueError, match=match):
            AverageAttention(**kwargs)
    x = random_normal(rng, (B, T, D))
    layer = AverageAttention(causal=False)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((B, T, T), bool))
    with pytest.raises(ValueError, match="causal"):
        layer(x, cache=layer.init_cache(B, T))
    causal = AverageAttention()
    causal.build(x.shape)
    with pytest.raises(ValueError, match="use_causal_mask=False"):
        causal(x, use_causal_mask=False, cache=causal.init_cache(B, T))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
@pytest.mark.parametrize("causal", [True, False])
def test_bad_padding_mask_raises(rng, causal, mask):
    layer = AverageAttention(causal=causal)
    raises_naming("padding_mask", lambda: layer(random_normal(rng, (B, T, D)), padding_mask=mask))


def test_bad_inputs_and_cache_raise(rng):
    layer = AverageAttention()
    layer(random_normal(rng, (B, T, D)))
    step = random_normal(rng, (B, T, D))[:, :1]
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T, D + 2)).astype("float32")))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, D)).astype("float32")))
    sums, counts = layer.init_cache(B)
    for bad in ((sums,), (sums, np.zeros((B + 1,), "float32")),
                (np.zeros((B, D - 1), "float32"), counts), sums):
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kernel_initializer="not_an_initializer"), "kernel_initializer"),
        (dict(bias_initializer=2), "bias_initializer"),
        (dict(activation="not_an_activation"), "activation"),
        (dict(intermediate_dim=True), "intermediate_dim"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: AverageAttention(**kwargs))
