"""ChunkedCrossEntropy against the plain loss on materialised logits: value and gradients (with
respect to the hidden states and the output table), sample weights, ignored tokens, label
smoothing, a `fit` step of `CausalLM`, saving, mixed precision and bad arguments."""

import keras
import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.ops import chunked_cross_entropy
from keras_xf.training import ChunkedCrossEntropy
from keras_xf.training import SmoothedSparseCrossEntropy
from tests import layer_checks as checks
from tests.layers.bad_inputs import raises_naming
from tests.models.tiny import seq2seq_lm

B, T, V, D = 2, 5, 37, 16
CHUNK = 3  # does not divide the 10 tokens: the last chunk holds padding rows


@pytest.fixture
def data(rng):
    hidden = rng.normal(size=(B, T, D)).astype("float32")
    table = (0.5 * rng.normal(size=(V, D))).astype("float32")
    labels = rng.integers(1, V, size=(B, T)).astype("int32")
    labels[1, 3:] = 0  # padding
    return hidden, table, labels


def _plain(loss, labels, sample_weight):
    """`loss(labels, float32(h · Eᵀ), sample_weight)` as a function of `(h, E)`."""

    def function(hidden, table):
        logits = keras.ops.matmul(hidden, keras.ops.transpose(table))
        return loss(labels, logits, sample_weight=sample_weight)

    return function


def _chunked(loss, labels, sample_weight, with_gradient=True):
    def function(hidden, table):
        return loss.from_hidden(labels, hidden, table, sample_weight, with_gradient=with_gradient)

    return function


def _assert_equal(result, expected, rtol=1e-5, atol=1e-6):
    (value, grads), (expected_value, expected_grads) = result, expected
    np.testing.assert_allclose(value, expected_value, rtol=rtol)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected_grad, rtol=rtol, atol=atol)


CASES = {
    "mean": ({}, None),
    "ignore_class, per-token weights": ({"ignore_class": 0}, "token"),
    "mean_with_sample_weight, per-sequence weights": (
        {"reduction": "mean_with_sample_weight"}, "sequence"),
    "sum, ignore_class": ({"reduction": "sum", "ignore_class": 0}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_value_and_gradients_equal_keras_sparse_cross_entropy(data, rng, case):
    """Compiled (a `jax.jit`, a `tf.function`; eager on PyTorch): the loss and its gradients
    with respect to `h` and `E` equal Keras's sparse cross-entropy on the full logits."""
    hidden, table, labels = data
    kwargs, weighting = CASES[case]
    shape = {"token": (B, T), "sequence": (B,)}.get(weighting)
    sample_weight = None if shape is None else rng.uniform(0.5, 2.0, shape).astype("float32")
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)
    chunked = ChunkedCrossEntropy(chunk_size=CHUNK, **kwargs)
    # Per-sequence weights [B] weigh each token of the sequence: Keras's loss takes no [B].
    keras_weight = sample_weight
    if weighting == "sequence":
        keras_weight = np.repeat(sample_weight[:, None], T, axis=1)
    expected = checks.value_and_gradients(_plain(plain, labels, keras_weight), [hidden, table])
    _assert_equal(checks.value_and_gradients(_chunked(chunked, labels, sample_weight),
                                             [hidden, table]), expected)
    # The plain form of the same loss object, on logits.
    _assert_equal(checks.value_and_gradients(_plain(chunked, labels, sample_weight),
                                             [hidden, table]), expected)


@pytest.mark.parametrize("chunk_size", [CHUNK, 10, 64])
def test_label_smoothing_equals_the_smoothed_loss(data, chunk_size):
    """With `ε > 0` and padding ignored it equals `SmoothedSparseCrossEntropy`, for a chunk
    that divides the tokens, one that does not, and one larger than all of them."""
    hidden, table, labels = data
    smoothed = SmoothedSparseCrossEntropy(0.1, pad_token_id=0)
    chunked = ChunkedCrossEntropy(chunk_size, label_smoothing=0.1, ignore_class=0)
    _assert_equal(checks.value_and_gradients(_chunked(chunked, labels, None), [hidden, table]),
                  checks.value_and_gradients(_plain(smoothed, labels, None), [hidden, table]))


@pytest.mark.skipif(checks.BACKEND != "tensorflow", reason="TensorFlow's graph loop")
def test_tensorflow_loop_without_xla(data):
    """TensorFlow's graph without XLA (Keras's `fit` on a CPU) runs the loop over
    `TensorArray`s; the gradient is the same."""
    hidden, table, labels = data
    chunked = ChunkedCrossEntropy(CHUNK, ignore_class=0)
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    _assert_equal(
        checks.value_and_gradients(_chunked(chunked, labels, None), [hidden, table], False),
        checks.value_and_gradients(_plain(plain, labels, None), [hidden, table], False))


@pytest.mark.skipif(checks.BACKEND != "tensorflow", reason="TensorFlow's graph loop")
@pytest.mark.parametrize("with_gradient", [True, False])
def test_tensorflow_loop_runs_one_chunk_at_a_time(data, with_gradient):
    """Without XLA TensorFlow's `while_loop` would start up to 10 iterations at once, each
    holding its own `[C, V]` blocks; the chunk loop asks for one at a time."""
    import tensorflow as tf

    hidden, table, labels = data
    weights = np.ones(labels.shape, "float32")
    concrete = tf.function(lambda h, e: chunked_cross_entropy(
        h, e, labels, weights, CHUNK, with_gradient=with_gradient)).get_concrete_function(
        tf.constant(hidden), tf.constant(table))
    loops = [op for op in concrete.graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert loops and all(op.get_attr("parallel_iterations") == 1 for op in loops)


def test_loss_only_and_all_ignored(data):
    """`with_gradient=False` (evaluation) gives the same value; all tokens ignored give 0."""
    hidden, table, labels = data
    chunked = ChunkedCrossEntropy(CHUNK, ignore_class=0)
    value = checks.to_numpy(chunked.from_hidden(labels, hidden, table))
    loss_only = checks.to_numpy(chunked.from_hidden(labels, hidden, table, with_gradient=False))
    np.testing.assert_allclose(loss_only, value, rtol=1e-6)
    zeros = np.zeros_like(labels)
    assert float(checks.to_numpy(chunked.from_hidden(zeros, hidden, table))) == 0.0
    # The op itself: Σ w ℓ with the weights as given.
    weights = np.full((B, T), 0.1, "float32")
    total = chunked_cross_entropy(hidden, table, labels, weights, chunk_size=4)
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        checks.to_numpy(total), checks.to_numpy(plain(labels, hidden @ table.T)), rtol=1e-5)


def _lm(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return CausalLM(vocabulary_size=V, num_layers=1, hidden_dim=D, num_heads=2,
                    intermediate_dim=32, max_sequence_length=8, **kwargs)


def _batch(rng):
    x = {"token_ids": rng.integers(1, V, size=(B, T)).astype("int32"),
         "padding_mask": np.ones((B, T), "int32")}
    y = rng.integers(1, V, size=(B, T)).astype("int32")
    y[1, 3:] = 0
    return x, y


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_fit_step_equals_the_plain_loss(rng, tie_embeddings):
    """One SGD step of `fit` (TensorFlow traces it with a free batch size) gives the weights
    and the logged loss of the plain loss; `evaluate` (the loss without its gradient)
    agrees; calls still give logits."""
    x, y = _batch(rng)
    sample_weight = (y != 0).astype("float32")
    results = []
    for loss in (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 ChunkedCrossEntropy(chunk_size=CHUNK)):
        model = _lm(tie_embeddings=tie_embeddings)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, weighted_metrics=None)
        history = model.fit(x, y, sample_weight=sample_weight, batch_size=B, verbose=0)
        evaluated = None
        if tie_embeddings:
            evaluated = model.evaluate(x, y, sample_weight=sample_weight, verbose=0)
        results.append((history.history["loss"][0], evaluated, model.get_weights()))
    assert tuple(model(x, training=True).shape) == (B, T, V)
    (plain_loss, plain_eval, plain_weights), (loss, evaluated, weights) = results
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
    if tie_embeddings:
        np.testing.assert_allclose(evaluated, plain_eval, rtol=1e-5)
    for weight, expected in zip(weights, plain_weights):
        np.testing.assert_allclose(weight, expected, rtol=1e-5, atol=1e-6)


def test_metrics_and_other_tasks_raise():
    model = _lm()
    raises_naming("metrics", lambda: model.compile(loss="chunked_cross_entropy",
                                                   metrics=["accuracy"]))
    raises_naming("weighted_metrics", lambda: model.compile(
        loss=ChunkedCrossEntropy(), weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()]))
    raises_naming("loss_weights", lambda: model.compile(loss=ChunkedCrossEntropy(),
                                                        loss_weights=[2.0]))
    raises_naming("Seq2SeqLM", lambda: seq2seq_lm().compile(loss=ChunkedCrossEntropy()))
    # The string form is the default loss object; "auto" metrics become none.
    model.compile(loss="chunked_cross_entropy")
    assert isinstance(model.loss, ChunkedCrossEntropy)
    assert model.loss.get_config() == ChunkedCrossEntropy().get_config()


def test_saved_model_keeps_its_loss_and_trains_alike(rng, tmp_path):
    """The compiled loss travels with a `.keras` file; the reloaded model's next step equals
    the original's."""
    x, y = _batch(rng)
    model = _lm()
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=ChunkedCrossEntropy(CHUNK, label_smoothing=0.1, ignore_class=0))
    model.fit(x, y, batch_size=B, verbose=0)
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.loss, ChunkedCrossEntropy)
    assert loaded.loss.get_config() == model.loss.get_config()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)
    for m in (model, loaded):
        m.fit(x, y, batch_size=B, verbose=0)
    for weight, expected in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(weight, expected, rtol=1e-5, atol=1e-6)


def test_mixed_bfloat16_loss_is_float32(data, rng):
    """bf16 hidden states and table: the logits are formed in bf16 and cast to float32, as
    the plain output layer does, and the loss is float32; a `fit` step runs."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    hidden, table, labels = data
    half_hidden, half_table = (keras.ops.cast(t, "bfloat16") for t in (hidden, table))
    chunked = ChunkedCrossEntropy(CHUNK, ignore_class=0)
    result = chunked.from_hidden(labels, half_hidden, half_table)
    assert keras.backend.standardize_dtype(result.dtype) == "float32"
    logits = keras.ops.cast(keras.ops.matmul(half_hidden, keras.ops.transpose(half_table)),
                            "float32")
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    np.testing.assert_allclose(checks.to_numpy(result), checks.to_numpy(plain(labels, logits)),
                               rtol=1e-5)
    x, y = _batch(rng)
    model = _lm()
    model.compile(loss=ChunkedCrossEntropy(CHUNK))
    history = model.fit(x, y, batch_size=B, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_bad_arguments_raise(data):
    hidden, table, labels = data
    raises_naming("chunk_size=0", lambda: ChunkedCrossEntropy(chunk_size=0))
    raises_naming("label_smoothing=1.0", lambda: ChunkedCrossEntropy(label_smoothing=1.0))
    raises_naming("reduction='none'", lambda: ChunkedCrossEntropy(reduction="none"))
    raises_naming("ignore_class='pad'", lambda: ChunkedCrossEntropy(ignore_class="pad"))
    loss = ChunkedCrossEntropy(CHUNK)
    raises_naming("y_true", lambda: loss.from_hidden(labels[..., None], hidden, table))
    raises_naming("sample_weight", lambda: loss.from_hidden(labels, hidden, table,
                                                            np.ones((B, T, 1), "float32")))
    raises_naming("hidden", lambda: loss.from_hidden(labels, hidden[..., :4], table))
    raises_naming("table", lambda: chunked_cross_entropy(hidden, table[0], labels,
                                                         np.ones((B, T), "float32")))
