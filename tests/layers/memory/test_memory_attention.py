"""MemoryAttention (Transformer-XL's chunk recurrence): chunks against the numpy recurrence,
one banded pass, the stateful memory in predict and fit, resets, the stopped gradient,
precision, XLA (TensorFlow and JAX), saving and wrong inputs."""

import keras
import numpy as np
import pytest

from keras_xf.layers import MemoryAttention
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import check_bad_padding_mask
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_numpy
from tests.reference import memory as ref

B, T, M, D, H = 2, 3, 4, 8, 2


def _layer(memory_length=M, position=None, **kwargs):
    attention = MultiHeadAttention(num_heads=H, num_key_value_heads=1, position=position)
    return MemoryAttention(attention, memory_length=memory_length, **kwargs)


def _built(rng, memory_length=M, position=None, **kwargs):
    layer = _layer(memory_length, position, **kwargs)
    layer(np.zeros((B, T, D), "float32"))
    checks.randomize_weights(layer.attention, rng)
    return layer


def _chunks(rng, count=3, length=T):
    return [random_normal(rng, (B, length, D)) for _ in range(count)]


def test_chunks_equal_the_numpy_recurrence():
    rng = np.random.default_rng(0)
    layer = _built(rng)
    chunks = _chunks(rng)
    masks = [np.ones((B, T), bool), padding_mask([T, 1], T), np.ones((B, T), bool)]
    expected, last_memory, last_valid = ref.memory_attention(
        chunks, checks.attention_weights(layer.attention), H, M, masks, num_key_value_heads=1)
    memory = memory_mask = None
    for chunk, mask, want in zip(chunks, masks, expected):
        result = layer(chunk, padding_mask=mask, memory=memory, memory_mask=memory_mask,
                       return_memory=True)
        np.testing.assert_allclose(to_numpy(result["outputs"]), want, atol=1e-5, rtol=1e-5)
        memory, memory_mask = result["memory"], result["memory_mask"]
    np.testing.assert_allclose(to_numpy(memory), last_memory, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(memory_mask), last_valid)


def test_chunks_with_memory_of_one_chunk_equal_one_banded_pass():
    # Relative positions (rotary) score each pair as in one pass over the whole sequence, in
    # which position i attends to its own chunk and the previous one (the maths of §5.2.1).
    rng = np.random.default_rng(1)
    layer = _built(rng, memory_length=T, position=RotaryEmbedding())
    chunks = _chunks(rng)
    sequence = np.concatenate(chunks, axis=1)
    i = np.arange(sequence.shape[1])[:, None]
    j = np.arange(sequence.shape[1])[None, :]
    band = (j <= i) & (j >= (i // T - 1) * T)
    full = to_numpy(layer.attention(sequence, attention_mask=np.broadcast_to(
        band, (B,) + band.shape)))
    memory, outputs = None, []
    for chunk in chunks:
        result = layer(chunk, memory=memory, return_memory=True)
        outputs.append(to_numpy(result["outputs"]))
        memory = result["memory"]
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5, rtol=1e-5)


def test_a_stateful_layer_carries_the_memory_between_calls():
    rng = np.random.default_rng(2)
    explicit = _built(rng)
    stateful = _layer(stateful=True, batch_size=B)
    stateful(np.zeros((B, T, D), "float32"))
    stateful.reset_memory()
    stateful.attention.set_weights(explicit.attention.get_weights())
    chunks = _chunks(rng)
    memory = valid = None
    for chunk in chunks:
        result = explicit(chunk, memory=memory, memory_mask=valid, return_memory=True)
        memory, valid = result["memory"], result["memory_mask"]
        np.testing.assert_allclose(to_numpy(stateful(chunk)), to_numpy(result["outputs"]),
                                   atol=1e-6)
    np.testing.assert_allclose(to_numpy(stateful.memory), to_numpy(memory), atol=1e-6)
    # `reset` empties the memory of row 0 only; `reset_memory()` of every row.
    fresh = to_numpy(explicit(chunks[0]))
    carried = to_numpy(explicit(chunks[0], memory=memory))
    reset = to_numpy(stateful(chunks[0], reset=np.array([True, False])))
    np.testing.assert_allclose(reset[0], fresh[0], atol=1e-6)
    np.testing.assert_allclose(reset[1], carried[1], atol=1e-6)
    stateful.reset_memory()
    np.testing.assert_allclose(to_numpy(stateful(chunks[0])), fresh, atol=1e-6)


def _stream_model(batch_size, vocabulary=11):
    tokens = keras.Input((T,), batch_size=batch_size, dtype="int32")
    hidden = keras.layers.Embedding(vocabulary, D)(tokens)
    hidden = _layer(stateful=True, batch_size=batch_size, name="memory_attention")(hidden)
    return keras.Model(tokens, keras.layers.Dense(vocabulary)(hidden))


def test_predict_and_fit_carry_the_memory_across_batches():
    # A stream of two rows, cut into chunks: batch k holds chunk k of each row.
    rng = np.random.default_rng(3)
    stream = rng.integers(0, 11, size=(B, 3 * T)).astype("int32")
    batches = np.concatenate([stream[:, k * T:(k + 1) * T] for k in range(3)], axis=0)
    model = _stream_model(B)
    layer = model.get_layer("memory_attention")
    predicted = model.predict(batches, batch_size=B, verbose=0)
    embedded = to_numpy(model.layers[1](stream))
    np.testing.assert_allclose(to_numpy(layer.memory), embedded[:, -M:], atol=1e-6)
    # The same chunks, one call each with the memory given explicitly.
    explicit = MemoryAttention.from_config(dict(layer.get_config(), stateful=False,
                                                batch_size=None))
    explicit(np.zeros((B, T, D), "float32"))
    explicit.attention.set_weights(layer.attention.get_weights())
    head, memory, valid = model.layers[-1], None, None
    for k in range(3):
        result = explicit(embedded[:, k * T:(k + 1) * T], memory=memory, memory_mask=valid,
                          return_memory=True)
        memory, valid = result["memory"], result["memory_mask"]
        np.testing.assert_allclose(predicted[k * B:(k + 1) * B],
                                   to_numpy(head(result["outputs"])), atol=1e-5)
    # fit at a learning rate of 0 reads and writes the memory as predict and evaluate do:
    # the same mean loss, and the last chunk's embeddings left in the memory.
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    labels = np.roll(batches, -1, axis=1)
    layer.reset_memory()
    evaluated = model.evaluate(batches, labels, batch_size=B, verbose=0)
    layer.reset_memory()
    history = model.fit(batches, labels, batch_size=B, shuffle=False, epochs=1, verbose=0)
    assert history.history["loss"][-1] == pytest.approx(evaluated, rel=1e-5)
    np.testing.assert_allclose(to_numpy(layer.memory), embedded[:, -M:], atol=1e-6)
    assert to_numpy(layer.memory_mask).all()


def test_no_gradient_flows_into_the_memory():
    rng = np.random.default_rng(4)
    layer = _built(rng)
    chunk, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, M, D))

    def loss(x, m):
        return keras.ops.sum(layer(x, memory=m) ** 2)

    _, (chunk_gradient, memory_gradient) = checks.value_and_gradients(
        loss, [chunk, memory], jit_compile=False)
    assert np.abs(chunk_gradient).max() > 0
    # JAX gives zeros; TensorFlow and PyTorch give no gradient for an unconnected input.
    unconnected = memory_gradient.dtype == object and memory_gradient.item() is None
    assert unconnected or not np.any(memory_gradient), memory_gradient


def test_fully_masked_rows_give_no_nan():
    rng = np.random.default_rng(5)
    layer = _built(rng)
    outputs = layer(_chunks(rng, 1)[0], padding_mask=np.zeros((B, T), bool),
                    memory=np.zeros((B, M, D), "float32"), memory_mask=np.zeros((B, M), bool))
    assert np.isfinite(to_numpy(outputs)).all()


def test_config_round_trip_and_saving(tmp_path):
    rng = np.random.default_rng(6)
    layer = _built(rng, position=RotaryEmbedding())
    checks.check_config_round_trip(layer)
    checks.check_config_round_trip(_layer(stateful=True, batch_size=B))
    inputs = [random_normal(rng, (B, T, D))]
    checks.check_saving(checks.wrap_in_model(layer, inputs), inputs, tmp_path)


@checks.xla_only
def test_jit_compile():
    inputs = [random_normal(np.random.default_rng(6), (B, T, D))]
    checks.check_jit_compile(checks.wrap_in_model(_layer(), inputs), inputs)


def test_stateful_memory_is_saved(tmp_path):
    model = _stream_model(B)
    model.predict(np.ones((B, T), "int32"), batch_size=B, verbose=0)
    path = str(tmp_path / "stream.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded.get_layer("memory_attention").memory),
                                  to_numpy(model.get_layer("memory_attention").memory))


def test_mixed_precision():
    rng = np.random.default_rng(7)
    result = checks.check_mixed_precision(
        lambda dtype: _layer(dtype=dtype), [random_normal(rng, (B, T, D))],
        {"return_memory": True}, policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(result["memory_mask"].dtype) == "bool"


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    layer = _layer()
    layer(np.zeros((B, T, D), "float32"))
    check_bad_padding_mask(layer, mask, (B, T, D))


def test_bad_arguments_and_inputs():
    x = np.zeros((B, T, D), "float32")
    raises_naming("memory_length", lambda: _layer(memory_length=0))
    raises_naming("batch_size", lambda: _layer(stateful=True))
    raises_naming("batch_size", lambda: _layer(batch_size=B))
    raises_naming("attention", lambda: MemoryAttention(keras.layers.Dense(4), memory_length=M))
    layer = _layer()
    layer(x)
    raises_naming("inputs", lambda: layer(np.zeros((B, T, D + 1), "float32")))
    raises_naming("memory", lambda: layer(x, memory=np.zeros((B, M + 1, D), "float32")))
    raises_naming("memory_mask", lambda: layer(x, memory=np.zeros((B, M, D), "float32"),
                                               memory_mask=np.ones((B, M + 1), bool)))
    raises_naming("memory", lambda: layer(x, memory_mask=np.ones((B, M), bool)))
    raises_naming("reset", lambda: layer(x, reset=np.ones((B + 1,), bool)))
    raises_naming("use_causal_mask", lambda: layer(x, use_causal_mask=False))
    raises_naming("stateful", layer.reset_memory)
    stateful = _layer(stateful=True, batch_size=B)
    stateful(x)
    raises_naming("batch_size", lambda: stateful(np.zeros((B + 1, T, D), "float32")))
    raises_naming("memory", lambda: stateful(x, memory=np.zeros((B, M, D), "float32")))
    raises_naming("batch_size", lambda: stateful.init_cache(B + 1, 8))
