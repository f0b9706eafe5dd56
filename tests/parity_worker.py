"""Runs the cross-backend parity model on the backend chosen by `KERAS_BACKEND`.

Usage: `KERAS_BACKEND=jax python tests/parity_worker.py OUT.npz`

Builds a tiny decoder-only language model from keras_xf layers, loads every weight from
`tests/data/parity_weights.npz` (matched by variable path, shapes checked), runs a forward
pass on the fixed batch stored in the same file, then 10 steps of plain SGD on a masked
sparse categorical cross-entropy. Writes the logits before and after training, the 10
losses and the trained weights to `OUT.npz` so that `test_cross_backend_parity.py` can
compare backends.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import LearnedPositionEmbedding  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import SinusoidalPositionEncoding  # noqa: E402
from keras_xf.layers import TokenEmbedding  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.layers import TransformerStack  # noqa: E402

VOCABULARY_SIZE = 32
WIDTH = 16
LENGTH = 8
BATCH_SIZE = 2
NUM_STEPS = 10
LEARNING_RATE = 0.1
WEIGHTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "parity_weights.npz")

# Keys of the parity file that are not weights.
BATCH_KEYS = ("token_ids", "padding_mask", "labels", "sample_weight", "weight_paths")
WEIGHT_PREFIX = "weight:"


def build_model():
    """Token + sinusoidal + learned positions, 2 pre-norm GQA blocks, tied LM head.

    Every weight is overwritten from the parity file, so the initializers are `"zeros"`:
    random initializers would cost one XLA compilation per shape on JAX.
    """
    token_ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    padding_mask = keras.Input((LENGTH,), dtype="bool", name="padding_mask")
    embedding = TokenEmbedding(
        VOCABULARY_SIZE, WIDTH, embeddings_initializer="zeros", name="token_embedding"
    )
    hidden = embedding(token_ids)
    hidden = hidden + SinusoidalPositionEncoding(name="sinusoidal_position")(hidden)
    hidden = hidden + LearnedPositionEmbedding(
        LENGTH, initializer="zeros", name="learned_position"
    )(hidden)
    block = TransformerBlock(
        MultiHeadAttention(
            num_heads=4,
            num_key_value_heads=2,
            causal=True,
            kernel_initializer="zeros",
            name="attention",
        ),
        FeedForward(2 * WIDTH, activation="gelu", kernel_initializer="zeros", name="feedforward"),
        norm_placement="pre",
        dropout=0.0,
        name="block",
    )
    hidden = TransformerStack(block, num_layers=2, name="stack")(hidden, padding_mask=padding_mask)
    logits = embedding(hidden, reverse=True)
    return keras.Model([token_ids, padding_mask], logits, name="parity_model")


def weight_specs(model):
    """`(path, shape)` of every model variable, in model order."""
    return [(w.path, tuple(w.shape)) for w in model.weights]


def load_parity_file(path=WEIGHTS_PATH):
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def load_weights(model, stored):
    """Assigns every variable from `stored` by path; the paths and shapes must match exactly."""
    weights = {k[len(WEIGHT_PREFIX) :]: v for k, v in stored.items() if k.startswith(WEIGHT_PREFIX)}
    paths = [w.path for w in model.weights]
    missing = sorted(set(paths) - set(weights))
    unused = sorted(set(weights) - set(paths))
    if missing or unused or len(paths) != len(set(paths)):
        raise ValueError(f"Weight paths differ. Missing: {missing}; unused: {unused}")
    if list(stored["weight_paths"]) != paths:
        raise ValueError(
            "The model's variable order differs from the parity file's. "
            f"Model: {paths}; file: {list(stored['weight_paths'])}"
        )
    for variable in model.weights:
        value = weights[variable.path]
        if tuple(variable.shape) != value.shape:
            raise ValueError(
                f"Shape mismatch for {variable.path}: model {tuple(variable.shape)}, "
                f"file {value.shape}"
            )
        variable.assign(value.astype(variable.dtype))


def run(out_path):
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    stored = load_parity_file()
    model = build_model()
    load_weights(model, stored)
    inputs = [stored["token_ids"], stored["padding_mask"]]

    logits = model.predict(inputs, batch_size=BATCH_SIZE, verbose=0)

    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    losses = []
    for _ in range(NUM_STEPS):
        loss = model.train_on_batch(
            inputs, stored["labels"], sample_weight=stored["sample_weight"]
        )
        losses.append(float(loss))
    trained_logits = model.predict(inputs, batch_size=BATCH_SIZE, verbose=0)

    results = {
        "logits": logits,
        "losses": np.asarray(losses, dtype="float64"),
        "trained_logits": trained_logits,
    }
    for variable in model.weights:
        results[WEIGHT_PREFIX + variable.path] = keras.ops.convert_to_numpy(variable)
    np.savez(out_path, backend=np.asarray(keras.config.backend()), **results)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: KERAS_BACKEND=<backend> python tests/parity_worker.py OUT.npz")
    run(sys.argv[1])
