"""FeedForward: `FFN(H) = act(H W_h + b_h) W_f + b_f` and its gated forms (survey §2.5)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers.feedforward.feed_forward import ACTIVATIONS
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import layers as ref
from tests.layers.bad_inputs import raises_naming

WIDTH, HIDDEN = 8, 16
GATED = {"swiglu": ref.silu, "geglu": ref.gelu, "geglu_tanh": ref.gelu_tanh}
PLAIN = {"relu": ref.relu, "gelu": ref.gelu, "gelu_tanh": ref.gelu_tanh, "silu": ref.silu}


def make_inputs(rng, width=WIDTH):
    return [rng.normal(size=(2, 5, width)).astype("float32")]


def make_layer(**kwargs):
    kwargs.setdefault("hidden_dim", HIDDEN)
    # Non-zero biases so that the reference comparison checks them too.
    kwargs.setdefault("bias_initializer", "random_normal")
    return FeedForward(**kwargs)


def reference_ffn(layer, x):
    """The numpy FFN of survey §2.5 evaluated with the layer's own weights."""

    def weights(dense):
        kernel = to_numpy(dense.kernel).astype("float64")
        bias = to_numpy(dense.bias).astype("float64") if layer.use_bias else None
        return kernel, bias

    w_h, b_h = weights(layer.hidden_dense)
    w_f, b_f = weights(layer.output_dense)
    x = x.astype("float64")
    if layer.activation in GATED:
        w_g, b_g = weights(layer.gate_dense)
        return ref.ffn(x, w_h, b_h, w_f, b_f, GATED[layer.activation], w_g=w_g, b_g=b_g)
    return ref.ffn(x, w_h, b_h, w_f, b_f, PLAIN[layer.activation])


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_build_creates_projections(activation):
    layer = make_layer(activation=activation)
    layer.build((2, 5, WIDTH))
    assert layer.built
    assert tuple(layer.hidden_dense.kernel.shape) == (WIDTH, HIDDEN)
    assert tuple(layer.output_dense.kernel.shape) == (HIDDEN, WIDTH)
    if activation in GATED:
        assert tuple(layer.gate_dense.kernel.shape) == (WIDTH, HIDDEN)
    else:
        assert layer.gate_dense is None


@pytest.mark.parametrize("activation", ["relu", "geglu"])
def test_projections_are_initialised_independently(activation):
    """Each projection draws its own values, even when one initializer is configured: identical
    gate and hidden kernels would make the gated unit start symmetric."""
    layer = FeedForward(WIDTH, activation=activation, bias_initializer="random_normal")
    layer.build((2, 5, WIDTH))  # hidden_dim = width: every kernel is [8, 8]
    denses = [layer.hidden_dense, layer.output_dense] + (
        [layer.gate_dense] if layer.gate_dense is not None else []
    )
    kernels = [to_numpy(d.kernel) for d in denses]
    for i in range(len(denses)):
        for j in range(i + 1, len(denses)):
            assert not np.allclose(kernels[i], kernels[j]), (denses[i].name, denses[j].name)
    if layer.gate_dense is not None:
        assert not np.allclose(to_numpy(layer.gate_dense.bias), to_numpy(layer.hidden_dense.bias))


@pytest.mark.parametrize("output_dim", [None, 5])
def test_output_shape(rng, output_dim):
    layer = make_layer(output_dim=output_dim)
    (x,) = make_inputs(rng)
    y = layer(x)
    expected = (2, 5, output_dim or WIDTH)
    assert tuple(y.shape) == expected
    assert tuple(layer.compute_output_shape(x.shape)) == expected
    # Any leading rank works: the FFN is position-wise.
    assert tuple(layer(x[0]).shape) == expected[1:]


def test_config_round_trip():
    layer = make_layer(activation="geglu", use_bias=False, dropout=0.25, output_dim=4)
    clone = check_config_round_trip(layer)
    assert clone.activation == "geglu"
    assert clone.use_bias is False
    assert clone.dropout == 0.25
    assert clone.output_dim == 4
    assert clone.hidden_dim == HIDDEN


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_weight_count(activation, use_bias):
    layer = make_layer(activation=activation, use_bias=use_bias)
    layer.build((2, 5, WIDTH))
    d, h = WIDTH, HIDDEN
    if activation in GATED:
        expected = 3 * d * h + (2 * h + d if use_bias else 0)
    else:
        # Survey §2.5, Table: 2·d·d_ffn + d + d_ffn.
        expected = 2 * d * h + (d + h if use_bias else 0)
    assert count_params(layer) == expected
    assert len(layer.trainable_weights) == len(layer.weights)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_fit_step(rng, activation):
    inputs = make_inputs(rng)
    model = wrap_in_model(make_layer(activation=activation, dropout=0.1), inputs)
    check_fit_step(model, inputs)


def test_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    model = wrap_in_model(make_layer(activation="swiglu", output_dim=6), inputs)
    loaded = check_saving(model, inputs, tmp_path)
    layer = loaded.layers[-1]
    assert isinstance(layer, FeedForward)
    assert layer.activation == "swiglu"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_mixed_precision(rng, policy, activation):
    outputs = check_mixed_precision(
        lambda dtype: make_layer(activation=activation, dtype=dtype),
        make_inputs(rng),
        policy=policy,
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_layer(activation="swiglu"), inputs), inputs)


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_matches_reference(rng, activation, use_bias):
    layer = make_layer(activation=activation, use_bias=use_bias)
    (x,) = make_inputs(rng)
    y = to_numpy(layer(x))
    np.testing.assert_allclose(y, reference_ffn(layer, x), atol=2e-5, rtol=1e-5)


def test_tanh_gated_gelu_is_its_own_option(rng):
    """`"geglu_tanh"` gates with ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (T5 1.1, Gemma), not
    with the exact GELU of `"geglu"`: the same weights give different outputs."""
    (x,) = make_inputs(rng)
    x = x * 3.0  # large gate values, where the two GELUs differ most
    tanh = make_layer(activation="geglu_tanh")
    exact = make_layer(activation="geglu")
    tanh.build(x.shape)
    exact.build(x.shape)
    exact.set_weights(tanh.get_weights())
    np.testing.assert_allclose(to_numpy(tanh(x)), reference_ffn(tanh, x), atol=2e-5, rtol=1e-5)
    assert np.abs(to_numpy(tanh(x)) - to_numpy(exact(x))).max() > 1e-4
    assert check_config_round_trip(tanh).activation == "geglu_tanh"
    raises_naming("activation", lambda: make_layer(activation="geglu_erf"))


def test_relu_is_default_and_clips_hidden_units():
    """With identity projections and zero biases, FFN(x) = ReLU(x) (survey footnote)."""
    layer = FeedForward(WIDTH, bias_initializer="zeros", kernel_initializer="identity")
    x = np.array([[[-1.0, 2.0, -3.0, 4.0, 0.5, -0.5, 0.0, 7.0]]], "float32")
    assert layer.activation == "relu"
    np.testing.assert_allclose(to_numpy(layer(x)), np.maximum(x, 0.0), atol=1e-6)


def test_dropout_on_hidden_layer(rng):
    layer = make_layer(dropout=0.5)
    (x,) = make_inputs(rng)
    inference = to_numpy(layer(x, training=False))
    np.testing.assert_allclose(inference, reference_ffn(layer, x), atol=2e-5, rtol=1e-5)
    trained = to_numpy(layer(x, training=True))
    assert not np.allclose(trained, inference)
    assert np.all(np.isfinite(trained))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"activation": "tanh"}, r"activation=\'tanh\'"),
        ({"activation": "swish_glu"}, r"activation=\'swish_glu\'"),
        ({"dropout": -0.1}, r"dropout=-0\.1"),
        ({"dropout": 1.0}, r"dropout=1\.0"),
        ({"hidden_dim": 0}, r"hidden_dim=0"),
        ({"output_dim": -2}, r"output_dim=-2"),
    ],
)
def test_invalid_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_layer(**kwargs)


def test_mismatched_input_width(rng):
    layer = make_layer()
    layer.build((2, 5, 16))
    with pytest.raises(ValueError, match=r"built for width 16.*inputs\.shape=\(2, 5, 8\)"):
        layer(make_inputs(rng, width=8)[0])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kernel_initializer": "not_an_initializer"}, "kernel_initializer"),
        ({"bias_initializer": 3}, "bias_initializer"),
        ({"hidden_dim": True}, "hidden_dim"),
        ({"dropout": "x"}, "dropout"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: make_layer(**kwargs))
