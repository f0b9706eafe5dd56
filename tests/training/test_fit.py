"""`model.fit` of a tiny CausalLM from numpy arrays, a tf.data dataset and a Python generator on
every backend (Keras 3 reads tf.data datasets on JAX and PyTorch too), with keras_xf's loss and
keras-hub's Perplexity as a metric.

One compiled model serves the three tests (each fit of a new model compiles its train step
again); every test restores its initial weights and optimizer state first, so each one trains
from the same start.
"""

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.training import SmoothedSparseCrossEntropy
from keras_xf.training import language_model_examples
from tests.models.tiny import causal_lm

LENGTH, BATCH, EPOCHS = 8, 16, 4


@pytest.fixture(scope="module")
def examples():
    """A periodic stream (period 7): next-token prediction is learnable in a few steps."""
    stream = np.tile(np.arange(3, 10), 40)
    x, y, _ = language_model_examples(stream, LENGTH, stride=3)
    n = len(y) // BATCH * BATCH  # whole batches only: one compiled train step
    return {k: v[:n] for k, v in x.items()}, y[:n]


@pytest.fixture(scope="module")
def compiled_lm():
    keras.utils.set_random_seed(3)
    # Rotary positions: an added sinusoid table (entries of size 1) would swamp the default
    # uniform(±0.05) token embeddings and slow learning down.
    model = causal_lm(num_layers=1, position="rotary")
    model.compile(
        optimizer=keras.optimizers.Adam(3e-2),
        loss=SmoothedSparseCrossEntropy(pad_token_id=None),
        metrics=[keras_hub.metrics.Perplexity(from_logits=True, mask_token_id=0)],
    )
    model.optimizer.build(model.trainable_variables)
    initial = [keras.ops.convert_to_numpy(w) for w in model.weights]
    return model, initial


@pytest.fixture
def lm(compiled_lm):
    """The compiled model with its initial weights and fresh optimizer slots."""
    model, initial = compiled_lm
    model.set_weights(initial)
    for variable in model.optimizer.variables:
        if not variable.path.endswith("learning_rate"):
            variable.assign(np.zeros(variable.shape, variable.dtype))
    return model


def assert_learns(history):
    losses = history.history["loss"]
    assert len(losses) == EPOCHS and np.all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses
    # No padding and equal batches: perplexity = exp(mean token cross-entropy) = exp(loss).
    np.testing.assert_allclose(history.history["perplexity"], np.exp(losses), rtol=1e-3)


def test_fit_on_numpy_arrays(lm, examples):
    x, y = examples
    history = lm.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    assert_learns(history)


def test_fit_on_a_tf_data_dataset(lm, examples):
    tf = pytest.importorskip("tensorflow")
    x, y = examples
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    assert_learns(lm.fit(dataset, epochs=EPOCHS, verbose=0))


def test_fit_on_a_python_generator(lm, examples):
    x, y = examples
    steps = len(y) // BATCH

    def batches():
        while True:
            for start in range(0, steps * BATCH, BATCH):
                window = slice(start, start + BATCH)
                yield {k: v[window] for k, v in x.items()}, y[window]

    assert_learns(lm.fit(batches(), steps_per_epoch=steps, epochs=EPOCHS, verbose=0))


def test_every_test_starts_from_the_same_weights(lm, compiled_lm):
    _, initial = compiled_lm
    for weight, value in zip(lm.weights, initial):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)
    assert int(keras.ops.convert_to_numpy(lm.optimizer.iterations)) == 0
