import keras
import numpy as np
import pytest

from keras_xf.layers.compression.downsample import Downsample
from keras_xf.layers.compression.upsample import Upsample
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import check_bad_padding_mask
from tests.layers.bad_inputs import check_bad_sequence_inputs
from tests.layers.bad_inputs import raises_naming
from tests.reference import sequence_compression as ref

B, T, D = 2, 7, 4


def _bias(layer):
    return None if layer.bias is None else to_float64(layer.bias)


@pytest.mark.parametrize("stride,kernel_size", [(2, None), (2, 3), (3, 4), (1, 2), (4, 4)])
@pytest.mark.parametrize("lengths", [None, (7, 3), (0, 5)])
def test_downsample_matches_reference(stride, kernel_size, lengths):
    rng = np.random.default_rng(0)
    x = random_normal(rng, (B, T, D))
    mask = None if lengths is None else padding_mask(lengths, T)
    layer = Downsample(stride, kernel_size)
    layer.build(x.shape)
    randomize_weights(layer, rng)
    expected, expected_mask = ref.downsample(x.astype("float64"), to_float64(layer.kernel),
                                             _bias(layer), stride, mask)
    if mask is None:
        outputs = layer(x)
    else:
        outputs, compressed = layer(x, padding_mask=mask)
        np.testing.assert_array_equal(checks.to_numpy(compressed), expected_mask)
    assert outputs.shape == (B, -(-T // stride), D)
    np.testing.assert_allclose(checks.to_numpy(outputs), expected, atol=1e-5)


def test_downsample_padding_never_leaks():
    rng = np.random.default_rng(1)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((4, 6), T)
    layer = Downsample(2, 3)
    noisy = np.where(mask[:, :, None], x, 1e3 * random_normal(rng, x.shape))
    a, mask_a = layer(x, padding_mask=mask)
    b, mask_b = layer(noisy, padding_mask=mask)
    np.testing.assert_allclose(checks.to_numpy(a), checks.to_numpy(b), atol=1e-5)
    np.testing.assert_array_equal(checks.to_numpy(mask_a), checks.to_numpy(mask_b))


@pytest.mark.parametrize("method", ["repeat", "transposed"])
@pytest.mark.parametrize("length", [7, 8])
def test_upsample_matches_reference(method, length):
    rng = np.random.default_rng(2)
    stride = 2
    x = random_normal(rng, (B, 4, D))
    residual = random_normal(rng, (B, length, D))
    mask = padding_mask((length, 3), length)
    layer = Upsample(stride, method)
    layer.build(x.shape)
    randomize_weights(layer, rng)
    kernel = None if layer.kernel is None else to_float64(layer.kernel)
    expected = ref.upsample(x.astype("float64"), stride, length, kernel, _bias(layer),
                            residual.astype("float64"), mask)
    outputs = layer(x, residual=residual, padding_mask=mask)
    np.testing.assert_allclose(checks.to_numpy(outputs), expected, atol=1e-5)
    plain = ref.upsample(x.astype("float64"), stride, length, kernel, _bias(layer))
    np.testing.assert_allclose(checks.to_numpy(layer(x, output_length=length)), plain, atol=1e-5)


def _round_trip_model():
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    compressed, compressed_mask = Downsample(2, 3, name="down")(x, padding_mask=mask)
    y = Upsample(2, "transposed", name="up")(compressed, residual=x, padding_mask=mask)
    return keras.Model([x, mask], [y, compressed_mask])


def test_model_fit_saving_and_gradients(tmp_path):
    rng = np.random.default_rng(3)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((5, 2), T)]
    model = _round_trip_model()
    down = model.get_layer("down")
    checks.check_config_round_trip(down)
    checks.check_config_round_trip(model.get_layer("up"))
    assert checks.count_params(down) == 3 * D * D + D
    checks.check_saving(model, inputs, tmp_path)

    mask = keras.ops.convert_to_tensor(inputs[1])

    def loss(x):
        outputs = model([x, mask])[0]
        return keras.ops.sum(outputs * outputs)

    _, (grad,) = checks.value_and_gradients(loss, [inputs[0]], jit_compile=False)
    assert np.all(np.isfinite(grad))
    # Padded positions reach no output (zeroed before the convolution, outputs masked).
    np.testing.assert_array_equal(grad[~inputs[1]], 0.0)
    assert np.any(grad[inputs[1]] != 0.0)
    model = keras.Model(model.inputs, model.outputs[0])
    checks.check_fit_step(model, inputs)


@checks.xla_only
def test_jit_compile():
    rng = np.random.default_rng(4)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((5, 2), T)]
    model = _round_trip_model()
    checks.check_jit_compile(keras.Model(model.inputs, model.outputs[0]), inputs)


def test_mixed_precision():
    rng = np.random.default_rng(5)
    checks.check_mixed_precision(lambda **kw: Downsample(2, 3, **kw),
                                 [random_normal(rng, (B, T, D))])
    checks.check_mixed_precision(lambda **kw: Upsample(2, "transposed", **kw),
                                 [random_normal(rng, (B, 4, D))])


@pytest.mark.parametrize("kwargs,name", [
    (dict(stride=0), "stride"),
    (dict(stride=2.5), "stride"),
    (dict(kernel_size=0), "kernel_size"),
    (dict(stride=3, kernel_size=2), "kernel_size"),
    (dict(use_bias="yes"), "use_bias"),
    (dict(kernel_initializer="nope"), "kernel_initializer"),
])
def test_bad_downsample_arguments(kwargs, name):
    raises_naming(name, lambda: Downsample(**kwargs))


@pytest.mark.parametrize("kwargs,name", [
    (dict(stride=-1), "stride"),
    (dict(method="nearest"), "method"),
    (dict(use_bias=1), "use_bias"),
])
def test_bad_upsample_arguments(kwargs, name):
    raises_naming(name, lambda: Upsample(**kwargs))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    check_bad_padding_mask(Downsample(2), mask, (B, T, D))


def test_bad_inputs():
    check_bad_sequence_inputs(lambda: Downsample(2), (B, T, D))
    up = Upsample(2)
    x = np.zeros((B, 4, D), "float32")
    raises_naming("output_length", lambda: up(x, output_length=9))
    raises_naming("output_length", lambda: up(x, output_length=6))
    raises_naming("residual", lambda: up(x, residual=np.zeros((B, 3, D), "float32")))
    raises_naming("residual", lambda: up(x, residual=np.zeros((B, 8, D + 1), "float32")))
    raises_naming("padding_mask", lambda: up(x, padding_mask=np.ones((8,), bool)))
    raises_naming("padding_mask", lambda: up(x, padding_mask=np.ones((B + 1, 8), bool)))
    raises_naming("output length", lambda: up(x, padding_mask=np.ones((B, 8), bool),
                                                output_length=7))
