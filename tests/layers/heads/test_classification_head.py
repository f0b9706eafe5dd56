"""ClassificationHead: `W_o · dropout(tanh(W_h x + b_h)) + b_o` with float32 logits."""

import keras
import numpy as np
import pytest

from keras_xf.layers import ClassificationHead
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Pooling
from keras_xf.layers import TransformerBlock
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

BATCH, LENGTH, WIDTH, HIDDEN, CLASSES = 2, 5, 8, 6, 3




def make_inputs(rng, rank=2):
    shape = (BATCH, WIDTH) if rank == 2 else (BATCH, LENGTH, WIDTH)
    return [rng.normal(size=shape).astype("float32")]


def make_layer(**kwargs):
    kwargs.setdefault("num_classes", CLASSES)
    return ClassificationHead(**kwargs)


def numpy_head(layer, x):
    x = x.astype("float64")
    if layer.hidden_dense is not None:
        w, b = (to_numpy(v).astype("float64") for v in layer.hidden_dense.weights)
        x = np.tanh(x @ w + b)
    w, b = (to_numpy(v).astype("float64") for v in layer.output_dense.weights)
    return x @ w + b


def randomize(layer, rng):
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))


@pytest.mark.parametrize("intermediate_dim", [None, HIDDEN])
def test_build(intermediate_dim):
    layer = make_layer(intermediate_dim=intermediate_dim)
    layer.build((BATCH, WIDTH))
    assert layer.built
    assert (layer.hidden_dense is None) == (intermediate_dim is None)
    assert tuple(layer.output_dense.kernel.shape) == (intermediate_dim or WIDTH, CLASSES)
    assert tuple(layer.compute_output_shape((BATCH, LENGTH, WIDTH))) == (BATCH, LENGTH, CLASSES)


def test_config_round_trip():
    layer = make_layer(
        intermediate_dim=HIDDEN, intermediate_activation="gelu", dropout=0.3, activation="softmax"
    )
    clone = check_config_round_trip(layer)
    assert (clone.num_classes, clone.intermediate_dim, clone.dropout) == (CLASSES, HIDDEN, 0.3)
    assert (clone.intermediate_activation, clone.activation) == ("gelu", "softmax")


@pytest.mark.parametrize(
    "intermediate_dim, expected",
    [
        (None, WIDTH * CLASSES + CLASSES),
        (HIDDEN, WIDTH * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES),
    ],
)
def test_weight_count(intermediate_dim, expected):
    layer = make_layer(intermediate_dim=intermediate_dim)
    layer.build((BATCH, WIDTH))
    assert count_params(layer) == expected


@pytest.mark.parametrize("intermediate_dim", [None, HIDDEN])
@pytest.mark.parametrize("rank", [2, 3])
def test_matches_numpy(rng, intermediate_dim, rank):
    layer = make_layer(intermediate_dim=intermediate_dim)
    (x,) = make_inputs(rng, rank)
    layer.build(x.shape)
    randomize(layer, rng)
    logits = layer(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(logits.shape) == x.shape[:-1] + (CLASSES,)
    np.testing.assert_allclose(to_numpy(logits), numpy_head(layer, x), atol=2e-5, rtol=1e-5)


def test_output_activation(rng):
    layer = make_layer(activation="softmax")
    (x,) = make_inputs(rng)
    probs = to_numpy(layer(x))
    logits = numpy_head(layer, x)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, expected, atol=1e-6)


def test_dropout_only_in_training(rng):
    layer = make_layer(intermediate_dim=HIDDEN, dropout=0.5)
    (x,) = make_inputs(rng)
    inference = to_numpy(layer(x, training=False))
    np.testing.assert_allclose(inference, numpy_head(layer, x), atol=2e-5, rtol=1e-5)
    assert not np.allclose(to_numpy(layer(x, training=True)), inference)


def test_fit_step(rng):
    inputs = make_inputs(rng)
    check_fit_step(wrap_in_model(make_layer(intermediate_dim=HIDDEN, dropout=0.1), inputs), inputs)


def test_saving(rng, tmp_path):
    inputs = make_inputs(rng, rank=3)
    model = wrap_in_model(make_layer(intermediate_dim=HIDDEN, activation="softmax"), inputs)
    loaded = check_saving(model, inputs, tmp_path)
    assert loaded.layers[-1].activation == "softmax"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_logits_are_float32(rng, policy):
    logits = check_mixed_precision(
        lambda dtype: make_layer(intermediate_dim=HIDDEN, dtype=dtype),
        make_inputs(rng),
        policy=policy,
    )
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


@pytest.mark.parametrize(
    "policy",
    ["mixed_float16", "mixed_bfloat16"],
)
def test_classifier_under_mixed_policy(rng, policy):
    """Block -> Pooling -> ClassificationHead under a global mixed policy: float32 logits, and
    a step of `fit` with a cross-entropy loss."""
    keras.config.set_dtype_policy(policy)  # reset to float32 by the conftest fixture
    tokens = keras.Input(shape=(LENGTH, WIDTH), name="x")
    mask = keras.Input(shape=(LENGTH,), dtype="bool", name="padding_mask")
    hidden = TransformerBlock(MultiHeadAttention(2), FeedForward(16), norm_placement="pre")(
        tokens, padding_mask=mask
    )
    assert keras.backend.standardize_dtype(hidden.dtype) == keras.DTypePolicy(policy).compute_dtype
    pooled = Pooling("mean")(hidden, padding_mask=mask)
    logits = ClassificationHead(CLASSES, intermediate_dim=HIDDEN)(pooled)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    model = keras.Model([tokens, mask], logits)
    x = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    padding = np.arange(LENGTH)[None] < np.array([[LENGTH], [0]])  # second row fully padded
    out = model.predict([x, padding], verbose=0)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit([x, padding], np.array([0, 2]), batch_size=BATCH, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_layer(intermediate_dim=HIDDEN), inputs), inputs)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"num_classes": 0}, r"num_classes=0"),
        ({"intermediate_dim": -1}, r"intermediate_dim=-1"),
        ({"dropout": -0.2}, r"dropout=-0\.2"),
        ({"dropout": 1.5}, r"dropout=1\.5"),
    ],
)
def test_invalid_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_layer(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"activation": "not_an_activation"}, "activation"),
        ({"intermediate_activation": 3}, "intermediate_activation"),
        ({"num_classes": True}, "num_classes"),
        ({"dropout": "x"}, "dropout"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: make_layer(**kwargs))


@pytest.mark.parametrize("intermediate_dim", [None, HIDDEN])
def test_bad_input_width_raises(rng, intermediate_dim):
    layer = make_layer(intermediate_dim=intermediate_dim)
    layer(rng.normal(size=(BATCH, WIDTH)).astype("float32"))
    raises_naming("inputs", lambda: layer(rng.normal(size=(BATCH, WIDTH + 1)).astype("float32")))
