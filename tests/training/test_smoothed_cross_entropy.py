"""SmoothedSparseCrossEntropy against numpy: smoothing, padding, sample weights, precision."""

import keras
import numpy as np
import pytest

from keras_xf.training import SmoothedSparseCrossEntropy
from tests.layers.bad_inputs import raises_naming

B, T, V = 3, 5, 7


@pytest.fixture
def data(rng):
    logits = (2.0 * rng.normal(size=(B, T, V))).astype("float32")
    labels = rng.integers(1, V, size=(B, T)).astype("int32")
    labels[0, 3:] = 0  # padding
    labels[2, 1:] = 0
    return labels, logits


def numpy_loss(labels, logits, smoothing=0.0, pad=0, sample_weight=None, from_logits=True):
    logits = logits.astype("float64")
    if from_logits:
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    else:
        log_probs = np.log(np.clip(logits, 1e-7, 1.0))
    nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    uniform = -log_probs.mean(axis=-1)
    losses = (1 - smoothing) * nll + smoothing * uniform
    weights = np.ones_like(losses) if pad is None else (labels != pad).astype("float64")
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, "float64")
        weights = weights * (sample_weight[:, None] if sample_weight.ndim == 1 else sample_weight)
    return (losses * weights).sum() / max(weights.sum(), 1.0)


def value(loss, *args, **kwargs):
    return float(keras.ops.convert_to_numpy(loss(*args, **kwargs)))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_matches_numpy(data, smoothing):
    labels, logits = data
    loss = SmoothedSparseCrossEntropy(label_smoothing=smoothing)
    np.testing.assert_allclose(value(loss, labels, logits), numpy_loss(labels, logits, smoothing),
                               rtol=1e-5)


def test_without_smoothing_equals_keras_cross_entropy_on_real_tokens(data):
    labels, logits = data
    mask = (labels != 0).astype("float32")
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    expected = value(keras_loss, labels, logits, sample_weight=mask) / mask.sum()
    np.testing.assert_allclose(value(SmoothedSparseCrossEntropy(), labels, logits), expected,
                               rtol=1e-5)


def test_padding_is_ignored(data):
    labels, logits = data
    loss = SmoothedSparseCrossEntropy(label_smoothing=0.1)
    changed = logits.copy()
    changed[labels == 0] = 100.0 * np.random.default_rng(1).normal(size=changed[labels == 0].shape)
    assert value(loss, labels, changed) == pytest.approx(value(loss, labels, logits), rel=1e-6)
    per_token = keras.ops.convert_to_numpy(loss.call(labels, logits))
    assert per_token.shape == (B, T) and (per_token[labels == 0] == 0).all()
    # pad_token_id=None counts every token; another pad id masks that id instead.
    np.testing.assert_allclose(
        value(SmoothedSparseCrossEntropy(0.1, pad_token_id=None), labels, logits),
        numpy_loss(labels, logits, 0.1, pad=None), rtol=1e-5)
    np.testing.assert_allclose(
        value(SmoothedSparseCrossEntropy(0.1, pad_token_id=3), labels, logits),
        numpy_loss(labels, logits, 0.1, pad=3), rtol=1e-5)


def test_all_padding_gives_zero(data):
    labels, logits = data
    assert value(SmoothedSparseCrossEntropy(0.1), np.zeros_like(labels), logits) == 0.0


@pytest.mark.parametrize("per_token", [False, True])
def test_sample_weight_is_honoured(data, rng, per_token):
    labels, logits = data
    weight = rng.uniform(0.0, 2.0, size=(B, T) if per_token else (B,)).astype("float32")
    loss = SmoothedSparseCrossEntropy(label_smoothing=0.1)
    np.testing.assert_allclose(value(loss, labels, logits, sample_weight=weight),
                               numpy_loss(labels, logits, 0.1, sample_weight=weight), rtol=1e-5)
    # A zero weight removes a sequence entirely.
    zero_first = np.array([0.0, 1.0, 1.0], "float32")
    np.testing.assert_allclose(value(loss, labels, logits, sample_weight=zero_first),
                               numpy_loss(labels[1:], logits[1:], 0.1), rtol=1e-5)


def test_probabilities_input(data):
    labels, logits = data
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    loss = SmoothedSparseCrossEntropy(0.1, from_logits=False)
    np.testing.assert_allclose(value(loss, labels, probabilities.astype("float32")),
                               numpy_loss(labels, probabilities, 0.1, from_logits=False),
                               rtol=1e-5)


def test_float32_under_mixed_bfloat16(data):
    keras.config.set_dtype_policy("mixed_bfloat16")
    labels, logits = data
    half = keras.ops.cast(logits, "bfloat16")
    loss = SmoothedSparseCrossEntropy(label_smoothing=0.1)
    result = loss(labels, half)
    assert keras.backend.standardize_dtype(result.dtype) == "float32"
    rounded = keras.ops.convert_to_numpy(keras.ops.cast(half, "float32"))
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(result)),
                               numpy_loss(labels, rounded, 0.1), rtol=1e-5)


def test_config_round_trip():
    loss = SmoothedSparseCrossEntropy(0.2, pad_token_id=5, from_logits=False, name="ls")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(clone, SmoothedSparseCrossEntropy)
    assert clone.get_config() == loss.get_config()
    assert (clone.label_smoothing, clone.pad_token_id, clone.from_logits) == (0.2, 5, False)


@pytest.mark.parametrize("smoothing", [-0.1, 1.0])
def test_invalid_smoothing_raises(smoothing):
    with pytest.raises(ValueError, match="label_smoothing"):
        SmoothedSparseCrossEntropy(label_smoothing=smoothing)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"label_smoothing": "x"}, "label_smoothing"), ({"pad_token_id": "0"}, "pad_token_id")],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: SmoothedSparseCrossEntropy(**kwargs))


def test_bad_labels_and_sample_weight_raise(data):
    labels, logits = data
    loss = SmoothedSparseCrossEntropy(0.1)
    for bad in (labels[..., None], labels[:, :-1], labels[:1]):
        raises_naming("y_true", lambda: loss(bad, logits))
    for weight in (np.ones((B + 1,), "float32"), np.ones((B, T + 1), "float32"),
                   np.ones((B, T, 1), "float32")):
        raises_naming("sample_weight", lambda: loss(labels, logits, sample_weight=weight))
