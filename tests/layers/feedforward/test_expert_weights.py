"""ExpertWeights: grouped per-expert projection against numpy, int8 / int4 quantisation
(per expert and output column) against the numpy quantiser, saving, gradients, errors."""

import keras
import numpy as np
import pytest

from keras_xf.layers import ExpertWeights
from tests import layer_checks as checks
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.layers.bad_inputs import raises_naming
from tests.reference import quantization as ref

E, R, D, F = 3, 4, 8, 5  # F odd: int4 packing pads the last byte
INDEX = np.array([2, 0, 2, 1], "int32")


def make(rng, **kwargs):
    layer = ExpertWeights(E, F, **kwargs)
    layer.build((None, None, D))
    if layer.expert_bias is not None:
        layer.expert_bias.assign(rng.normal(size=(E, F)).astype("float32"))
    return layer


@pytest.mark.parametrize("expert_index", [None, INDEX], ids=["per-expert", "gathered"])
def test_matches_reference(rng, expert_index):
    layer = make(rng)
    groups = E if expert_index is None else len(expert_index)
    x = random_normal(rng, (groups, R, D))
    expected = ref.grouped_linear(x, to_float64(layer.expert_kernel),
                                  to_float64(layer.expert_bias), expert_index)
    np.testing.assert_allclose(to_float64(layer(x, expert_index=expert_index)), expected,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_matches_per_channel_reference(rng, mode):
    layer = make(rng)
    kernel = to_float64(layer.expert_kernel)
    layer.quantize(mode)
    assert layer.quantization_mode == mode
    q, s = ref.abs_max_quantize(kernel, axis=1, mode=mode)
    stored = layer.expert_kernel
    assert keras.backend.standardize_dtype(stored.dtype) == "int8"
    assert tuple(stored.shape) == ((E, D, F) if mode == "int8" else (E, D, (F + 1) // 2))
    np.testing.assert_array_equal(to_float64(layer._integer_kernel()), q)
    np.testing.assert_allclose(to_float64(layer.expert_kernel_scale), s[:, 0], rtol=1e-6)
    for expert_index in (None, INDEX):
        groups = E if expert_index is None else len(expert_index)
        x = random_normal(rng, (groups, R, D))
        expected = ref.quantized_grouped_linear(x, kernel, to_float64(layer.expert_bias),
                                                expert_index, mode)
        actual = to_float64(layer(x, expert_index=expert_index))
        np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)
        # Close to the float layer: the rounding error of the chosen grid only.
        exact = ref.grouped_linear(x, kernel, to_float64(layer.expert_bias), expert_index)
        assert np.abs(actual - exact).max() < (0.05 if mode == "int8" else 0.5) * np.abs(
            exact).max()


def test_float8_is_refused_and_model_quantize_warns(rng):
    layer = make(rng)
    with pytest.warns(UserWarning, match="int8' and 'int4"):
        layer.quantize("float8")
    assert layer.quantization_mode is None
    x = random_normal(rng, (E, R, D))
    model = checks.wrap_in_model(layer, [x])
    with pytest.warns(UserWarning, match="ExpertWeights supports"):
        model.quantize("float8")
    assert layer.quantization_mode is None
    assert keras.backend.standardize_dtype(layer.expert_kernel.dtype) == "float32"


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_saving_and_input_gradients(rng, mode, tmp_path):
    """A `.keras` round trip keeps the quantised layer; `fit` still trains the layers before
    it (the gradient reaches the inputs through the dequantised kernel)."""
    x = random_normal(rng, (E, R, D))
    inputs = keras.Input((R, D))
    before = keras.layers.Dense(D, name="before")
    model = keras.Model(inputs, ExpertWeights(E, F, name="experts")(before(inputs)))
    model.get_layer("experts").quantize(mode)  # only the experts: `before` stays trainable
    loaded = checks.check_saving(model, [x], tmp_path)
    assert loaded.get_layer("experts").quantization_mode == mode
    kernel = checks.to_numpy(before.kernel).copy()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, np.ones((E, R, F), "float32"), batch_size=E, epochs=1, verbose=0)
    assert not np.allclose(checks.to_numpy(before.kernel), kernel)


def test_config_weights_and_mixed_precision(rng):
    layer = ExpertWeights(E, F, use_bias=False, init_slices="rows")
    checks.check_config_round_trip(layer)
    layer.build((None, None, D))
    assert checks.count_params(layer) == E * D * F
    outputs = checks.check_mixed_precision(lambda **kw: ExpertWeights(E, F, **kw),
                                           [random_normal(rng, (E, R, D))])
    assert keras.backend.standardize_dtype(outputs.dtype) == "float16"


def test_slice_initialisation_cuts_one_matrix(rng):
    init = keras.initializers.RandomNormal(seed=4)
    columns = ExpertWeights(E, F, kernel_initializer=init, init_slices="columns")
    columns.build((None, None, D))
    full = to_float64(keras.initializers.RandomNormal(seed=4)((D, E * F)))
    np.testing.assert_allclose(to_float64(columns.expert_kernel),
                               full.reshape(D, E, F).transpose(1, 0, 2), rtol=1e-6)


def test_errors(rng):
    raises_naming("num_experts", lambda: ExpertWeights(0, F))
    raises_naming("units", lambda: ExpertWeights(E, -1))
    raises_naming("use_bias", lambda: ExpertWeights(E, F, use_bias="yes"))
    raises_naming("init_slices", lambda: ExpertWeights(E, F, init_slices="diagonal"))
    layer = make(rng)
    raises_naming("inputs", lambda: layer(random_normal(rng, (E, R, D + 1))))
    raises_naming("inputs", lambda: layer(random_normal(rng, (E, D))))
    raises_naming("num_experts", lambda: layer(random_normal(rng, (E + 1, R, D))))
    raises_naming("expert_index", lambda: layer(random_normal(rng, (2, R, D)),
                                                expert_index=INDEX))
