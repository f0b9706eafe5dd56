"""`model.fit` of a tiny CausalLM from tf.data, a Python generator and numpy arrays on every
backend (Keras 3 reads tf.data datasets on JAX and PyTorch too), with keras-hub's Perplexity.
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


def make_model(loss="auto", metrics=None):
    # Rotary positions: an added sinusoid table (entries of size 1) would swamp the default
    # uniform(±0.05) token embeddings and slow learning down.
    model = causal_lm(num_layers=1, position="rotary")
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss=loss, metrics=metrics)
    return model


def assert_learns(history):
    losses = history.history["loss"]
    assert len(losses) == EPOCHS and np.all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses


def test_fit_on_numpy_arrays(examples):
    x, y = examples
    model = make_model()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    assert_learns(history)
    assert "accuracy" in history.history


def test_fit_on_a_tf_data_dataset(examples):
    tf = pytest.importorskip("tensorflow")
    x, y = examples
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model = make_model(loss=SmoothedSparseCrossEntropy(label_smoothing=0.1, pad_token_id=None))
    assert_learns(model.fit(dataset, epochs=EPOCHS, verbose=0))


def test_fit_on_a_python_generator_with_perplexity(examples):
    x, y = examples
    steps = len(y) // BATCH

    def batches():
        while True:
            for start in range(0, steps * BATCH, BATCH):
                window = slice(start, start + BATCH)
                yield {k: v[window] for k, v in x.items()}, y[window]

    perplexity = keras_hub.metrics.Perplexity(from_logits=True, mask_token_id=0)
    model = make_model(metrics=[perplexity])
    history = model.fit(batches(), steps_per_epoch=steps, epochs=EPOCHS, verbose=0)
    assert_learns(history)
    # No padding and equal batches: perplexity = exp(mean token cross-entropy) = exp(loss).
    np.testing.assert_allclose(history.history["perplexity"], np.exp(history.history["loss"]),
                               rtol=1e-3)
    assert history.history["perplexity"][-1] < history.history["perplexity"][0]
