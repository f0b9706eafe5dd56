"""StopClassifier: the stop logit `z_i = w_o · act(W_h s_i + b_h) + b_o` of each position and
`Pr(stop | s_i) = σ(z_i)` (survey §5.6)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import StopClassifier
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layers.bad_inputs import raises_naming
from tests.reference.early_exit import stop_logits

BATCH, LENGTH, WIDTH, HIDDEN = 2, 5, 8, 6


def make_inputs(rng):
    return [rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")]


def randomize(layer, rng):
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))


def numpy_weights(layer):
    head = layer.head
    dense = [] if head.hidden_dense is None else [head.hidden_dense]
    return [tuple(to_numpy(v) for v in d.weights) for d in dense + [head.output_dense]]


@pytest.mark.parametrize("intermediate_dim", [None, HIDDEN])
def test_matches_reference(rng, intermediate_dim):
    layer = StopClassifier(intermediate_dim=intermediate_dim)
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize(layer, rng)
    logits = layer(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(logits.shape) == (BATCH, LENGTH)
    expected = stop_logits(x, numpy_weights(layer))
    np.testing.assert_allclose(to_numpy(logits), expected, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(layer.stop_probability(x)), 1 / (1 + np.exp(-expected)),
                               atol=1e-6)


@pytest.mark.parametrize(
    "intermediate_dim, expected",
    [(None, WIDTH + 1), (HIDDEN, WIDTH * HIDDEN + HIDDEN + HIDDEN + 1)],
)
def test_weight_count_and_width(intermediate_dim, expected):
    layer = StopClassifier(intermediate_dim=intermediate_dim)
    assert layer.input_dim is None
    layer.build((BATCH, LENGTH, WIDTH))
    assert count_params(layer) == expected
    assert layer.input_dim == WIDTH
    assert tuple(layer.compute_output_shape((BATCH, LENGTH, WIDTH))) == (BATCH, LENGTH)


def test_config_round_trip():
    layer = StopClassifier(intermediate_dim=HIDDEN, intermediate_activation="gelu", dropout=0.2)
    clone = check_config_round_trip(layer)
    assert (clone.intermediate_dim, clone.intermediate_activation, clone.dropout) == (
        HIDDEN, "gelu", 0.2)


def test_fit_and_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    model = wrap_in_model(StopClassifier(intermediate_dim=HIDDEN, dropout=0.1), inputs)
    check_fit_step(model, inputs)
    check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_logits_are_float32(rng, policy):
    logits = check_mixed_precision(
        lambda dtype: StopClassifier(intermediate_dim=HIDDEN, dtype=dtype), make_inputs(rng),
        policy=policy)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"intermediate_dim": 0}, "intermediate_dim"),
        ({"intermediate_dim": 2.5}, "intermediate_dim"),
        ({"intermediate_activation": "not_an_activation"}, "intermediate_activation"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: StopClassifier(**kwargs))


@pytest.mark.parametrize("intermediate_dim", [None, HIDDEN])
def test_bad_inputs_raise(rng, intermediate_dim):
    layer = StopClassifier(intermediate_dim=intermediate_dim)
    (x,) = make_inputs(rng)
    layer(x)
    raises_naming("inputs", lambda: layer(x[:, 0]))  # [B, d]: no time axis
    raises_naming("inputs", lambda: layer(x[..., :-1]))  # another width
    raises_naming("inputs", lambda: StopClassifier().build((BATCH, WIDTH)))
