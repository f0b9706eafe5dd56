"""OffsetRMSNormalization: `h / √(mean(h²) + ε) ⊙ (1 + w)`, the scale held as its offset `w`
(survey §2.4), and `normalization="offset_rms_norm"` in the blocks and stacks."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import OffsetRMSNormalization
from keras_xf.layers import Residual
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.layers.bad_inputs import raises_naming
from tests.reference import layers as ref

WIDTH, EPSILON = 8, 1e-6


def make_inputs(rng, width=WIDTH):
    return [rng.normal(size=(2, 5, width)).astype("float32") * 3.0]


def randomized(rng, **kwargs):
    layer = OffsetRMSNormalization(epsilon=EPSILON, **kwargs)
    layer.build((2, 5, WIDTH))
    layer.scale.assign(rng.normal(size=WIDTH).astype("float32"))
    return layer


def test_matches_reference(rng):
    layer = randomized(rng)
    (x,) = make_inputs(rng)
    offset = to_numpy(layer.scale).astype("float64")
    expected = ref.rms_norm(x.astype("float64"), 1.0 + offset, epsilon=EPSILON)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=2e-5, rtol=1e-5)


def test_starts_as_plain_rms_normalization_and_equals_keras_with_one_plus_w(rng):
    (x,) = make_inputs(rng)
    fresh = OffsetRMSNormalization(epsilon=EPSILON)
    plain = keras.layers.RMSNormalization(epsilon=EPSILON)
    np.testing.assert_allclose(to_numpy(fresh(x)), to_numpy(plain(x)), atol=1e-6)
    np.testing.assert_array_equal(to_numpy(fresh.scale), np.zeros(WIDTH))
    layer = randomized(rng)
    plain.scale.assign(1.0 + to_numpy(layer.scale))
    np.testing.assert_allclose(to_numpy(layer(x)), to_numpy(plain(x)), atol=1e-6)


def test_config_round_trip_and_weights():
    layer = OffsetRMSNormalization(epsilon=1e-5, name="norm")
    clone = check_config_round_trip(layer)
    assert clone.epsilon == 1e-5
    clone.build((2, 5, WIDTH))
    assert count_params(clone) == WIDTH
    assert tuple(clone.compute_output_shape((2, 5, WIDTH))) == (2, 5, WIDTH)


def test_fit_step_and_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    layer = OffsetRMSNormalization()
    model = wrap_in_model(layer, inputs)
    layer.scale.assign(rng.normal(size=WIDTH).astype("float32"))
    loaded = check_saving(model, inputs, tmp_path)
    assert isinstance(loaded.layers[-1], OffsetRMSNormalization)
    check_fit_step(model, inputs)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    outputs = check_mixed_precision(lambda dtype: OffsetRMSNormalization(dtype=dtype),
                                    make_inputs(rng), policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


def test_offset_is_read_in_float32_under_mixed_bfloat16():
    """`1 + w` in float32, then one rounding of the product: `w = 2⁻⁸ + 2⁻¹⁷` gives
    `1 + w` just above the midpoint between bfloat16's 1 and 1 + 2⁻⁷, so it rounds up; a `w`
    read in bfloat16 (2⁻⁸) would land on the midpoint and round down to 1."""
    layer = OffsetRMSNormalization(epsilon=EPSILON, dtype="mixed_bfloat16")
    x = np.ones((1, 1, WIDTH), "float32")
    layer.build(x.shape)
    layer.scale.assign(np.full(WIDTH, 2.0**-8 + 2.0**-17, "float32"))
    outputs = to_numpy(keras.ops.cast(layer(x), "float32"))
    np.testing.assert_array_equal(outputs, np.full((1, 1, WIDTH), 1.0 + 2.0**-7, "float32"))


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(OffsetRMSNormalization(), inputs), inputs)


@pytest.mark.parametrize("epsilon", [0.0, -1e-6, float("nan"), "x"])
def test_bad_epsilon_raises(epsilon):
    raises_naming("epsilon", lambda: OffsetRMSNormalization(epsilon=epsilon))


def test_bad_inputs_raise(rng):
    layer = OffsetRMSNormalization()
    layer.build((2, 5, WIDTH))
    raises_naming("inputs", lambda: layer(make_inputs(rng, width=WIDTH + 1)[0]))


# --- normalization="offset_rms_norm" ------------------------------------------------------


def test_residual_and_block_use_it(rng):
    (x,) = make_inputs(rng)
    residual = Residual(FeedForward(16), norm_placement="pre", normalization="offset_rms_norm",
                        epsilon=EPSILON)
    residual.build(x.shape)
    residual.norm.scale.assign(rng.normal(size=WIDTH).astype("float32"))
    assert isinstance(residual.norm, OffsetRMSNormalization)
    offset = to_numpy(residual.norm.scale).astype("float64")
    normed = ref.rms_norm(x.astype("float64"), 1.0 + offset, epsilon=EPSILON)
    expected = to_numpy(residual.layer(normed.astype("float32"))) + x
    np.testing.assert_allclose(to_numpy(residual(x)), expected, atol=2e-5, rtol=1e-5)
    clone = check_config_round_trip(residual)
    assert clone.normalization == "offset_rms_norm"

    block = TransformerBlock(MultiHeadAttention(2), FeedForward(16),
                             normalization="offset_rms_norm", norm_placement="pre")
    stack = TransformerStack(block, num_layers=2)
    stack.build(x.shape)
    norms = [stack.output_norm] + [b.mixer_residual.norm for b in stack.blocks]
    assert all(isinstance(n, OffsetRMSNormalization) for n in norms)
    assert check_config_round_trip(block).normalization == "offset_rms_norm"


def test_unknown_normalization_raises():
    message = raises_naming("normalization", lambda: Residual(
        FeedForward(16), normalization="offset_layer_norm"))
    assert "offset_rms_norm" in message
