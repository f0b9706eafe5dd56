"""CompressiveMemoryAttention (survey §5.2.2): chunks against the numpy recurrence for each
compression, the stateful memories in predict and fit, resets, decoding from `[c ; m]`, a
CausalLM that generates from both memories, the stopped gradient, precision, XLA, saving and
wrong inputs."""

import keras
import numpy as np
import pytest

from keras_xf.layers import CompressiveMemoryAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_numpy
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.reference import memory as ref

B, T, M, N, R, D, H = 2, 4, 4, 3, 2, 8, 2
STATE = ("memory", "memory_mask", "compressed", "compressed_count")


def _layer(compression="mean", memory_length=M, position=None, **kwargs):
    attention = MultiHeadAttention(num_heads=H, num_key_value_heads=1, position=position)
    running = compression == "running_mean"
    return CompressiveMemoryAttention(
        attention, memory_length=memory_length, compressed_length=1 if running else N,
        compression=compression, compression_rate=1 if running else R, **kwargs)


def _built(rng, compression="mean", memory_length=M, **kwargs):
    layer = _layer(compression, memory_length, **kwargs)
    layer(np.zeros((B, T, D), "float32"))
    checks.randomize_weights(layer.attention, rng)
    return layer


def _chunks(rng, count=4, length=T):
    return [random_normal(rng, (B, length, D)) for _ in range(count)]


@pytest.mark.parametrize("compression, memory_length, length",
                         [("mean", M, T), ("max", 2, T), ("mean", M, 3), ("running_mean", 3, T)])
def test_chunks_equal_the_numpy_recurrence(compression, memory_length, length):
    # Four chunks: the long-term memory of N = 3 slots overflows at the third (two slots a
    # chunk); with a local memory shorter than the chunk, positions of the chunk itself are
    # let go at once; chunks of 3 leave a last group of one position.
    rng = np.random.default_rng(0)
    layer = _built(rng, compression, memory_length)
    chunks = _chunks(rng, length=length)
    masks = [np.ones((B, length), bool), padding_mask([length, 1], length),
             padding_mask([2, length], length), np.ones((B, length), bool)]
    running = compression == "running_mean"
    expected, *last = ref.compressive_memory_attention(
        chunks, checks.attention_weights(layer.attention), H, memory_length,
        1 if running else N, compression, R, masks)
    state = {}
    for chunk, mask, want in zip(chunks, masks, expected):
        result = layer(chunk, padding_mask=mask, return_memory=True, **state)
        np.testing.assert_allclose(to_numpy(result["outputs"]), want, atol=1e-5, rtol=1e-5)
        state = {name: result[name] for name in STATE}
    for name, want in zip(STATE, last):
        np.testing.assert_allclose(to_numpy(state[name]), want, atol=1e-5, rtol=1e-5)
    assert to_numpy(state["compressed_count"]).max() > 0  # the long-term memory is in use


def test_a_stateful_layer_carries_both_memories_and_resets_them():
    rng = np.random.default_rng(1)
    explicit = _built(rng)
    stateful = _layer(stateful=True, batch_size=B)
    stateful(np.zeros((B, T, D), "float32"))
    stateful.reset_memory()
    stateful.attention.set_weights(explicit.attention.get_weights())
    state = {}
    for chunk in _chunks(rng, 3):
        result = explicit(chunk, return_memory=True, **state)
        state = {name: result[name] for name in STATE}
        np.testing.assert_allclose(to_numpy(stateful(chunk)), to_numpy(result["outputs"]),
                                   atol=1e-6)
    for name in STATE:
        np.testing.assert_allclose(to_numpy(getattr(stateful, name)), to_numpy(state[name]),
                                   atol=1e-6)
    chunk = _chunks(rng, 1)[0]
    fresh = to_numpy(explicit(chunk))
    carried = to_numpy(explicit(chunk, **state))
    reset = to_numpy(stateful(chunk, reset=np.array([True, False])))
    np.testing.assert_allclose(reset[0], fresh[0], atol=1e-6)
    np.testing.assert_allclose(reset[1], carried[1], atol=1e-6)
    stateful.reset_memory()
    assert not to_numpy(stateful.compressed_count).any()
    np.testing.assert_allclose(to_numpy(stateful(chunk)), fresh, atol=1e-6)


def test_decoding_reads_both_memories_as_one_pass_does():
    rng = np.random.default_rng(2)
    layer = _built(rng, position=RotaryEmbedding(), stateful=True, batch_size=B)
    for chunk in _chunks(rng, 3):
        layer(chunk)
    saved = [to_numpy(getattr(layer, name)).copy() for name in STATE]
    chunk = _chunks(rng, 1)[0]
    cache = layer.init_cache(B, T)
    decoded = []
    for t in range(T):
        outputs, cache = layer(chunk[:, t:t + 1], cache=cache, cache_index=t)
        decoded.append(to_numpy(outputs))
    for name, value in zip(STATE, saved):
        np.testing.assert_array_equal(to_numpy(getattr(layer, name)), value)
    np.testing.assert_allclose(np.concatenate(decoded, axis=1), to_numpy(layer(chunk)),
                               atol=1e-5, rtol=1e-5)


def _memory_lm():
    attention = MultiHeadAttention(HEADS, position=RotaryEmbedding())
    mixer = CompressiveMemoryAttention(attention, memory_length=M, compressed_length=N,
                                       compression_rate=R, stateful=True, batch_size=B)
    block = TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")
    return randomize_embeddings(causal_lm(block=block, num_layers=2, position="none"))


def _states(lm):
    return [[to_numpy(getattr(block.mixer, name)).copy() for name in STATE]
            for block in lm.backbone.transformer_stack.blocks]


def _restore(lm, states):
    for block, values in zip(lm.backbone.transformer_stack.blocks, states):
        for name, value in zip(STATE, values):
            getattr(block.mixer, name).assign(value)


def test_a_causal_lm_trains_over_a_stream_and_generates_from_its_memories():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(3)
    lm = _memory_lm()
    stream = rng.integers(1, 32, size=(B, 4 * T + 1)).astype("int32")
    inputs = np.concatenate([stream[:, k * T:(k + 1) * T] for k in range(4)])
    labels = np.concatenate([stream[:, k * T + 1:(k + 1) * T + 1] for k in range(4)])
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = lm.fit({"token_ids": inputs, "padding_mask": np.ones_like(inputs)}, labels,
                     batch_size=B, shuffle=False, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    states = _states(lm)
    assert all(values[3].min() > 0 for values in states)  # every slot filled by the stream
    prompts = inputs[-B:, :3]
    generated = lm.generate(prompts, max_length=7)
    tokens = prompts  # greedy full passes, each reading the memories and restoring them
    for _ in range(4):
        logits = lm.predict({"token_ids": tokens, "padding_mask": np.ones_like(tokens)},
                            batch_size=B, verbose=0)
        _restore(lm, states)
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], 1)
    np.testing.assert_array_equal(generated, tokens)
    for before, after in zip(states, _states(lm)):
        for value, now in zip(before, after):
            np.testing.assert_array_equal(now, value)


def test_no_gradient_flows_into_the_memories():
    rng = np.random.default_rng(4)
    layer = _built(rng)
    chunk = random_normal(rng, (B, T, D))
    memory, compressed = random_normal(rng, (B, M, D)), random_normal(rng, (B, N, D))

    def loss(x, m, c):
        return keras.ops.sum(layer(x, memory=m, compressed=c) ** 2)

    _, (chunk_gradient, *memory_gradients) = checks.value_and_gradients(
        loss, [chunk, memory, compressed], jit_compile=False)
    assert np.abs(chunk_gradient).max() > 0
    for gradient in memory_gradients:
        # JAX gives zeros; TensorFlow and PyTorch give no gradient for an unconnected input.
        unconnected = gradient.dtype == object and gradient.item() is None
        assert unconnected or not np.any(gradient), gradient


@pytest.mark.parametrize("compression", ["max", "running_mean"])
def test_fully_masked_rows_give_no_nan(compression):
    rng = np.random.default_rng(5)
    layer = _built(rng, compression)
    result = layer(_chunks(rng, 1)[0], padding_mask=np.zeros((B, T), bool), return_memory=True)
    for value in result.values():
        assert np.isfinite(to_numpy(value).astype("float32")).all()
    assert not to_numpy(result["compressed_count"]).any()


def test_config_round_trip_and_saving(tmp_path):
    rng = np.random.default_rng(6)
    layer = _built(rng, "max", position=RotaryEmbedding())
    checks.check_config_round_trip(layer)
    checks.check_config_round_trip(_layer("running_mean", stateful=True, batch_size=B))
    inputs = [random_normal(rng, (B, T, D))]
    checks.check_saving(checks.wrap_in_model(layer, inputs), inputs, tmp_path)


@checks.xla_only
def test_jit_compile():
    inputs = [random_normal(np.random.default_rng(7), (B, T, D))]
    checks.check_jit_compile(checks.wrap_in_model(_layer(), inputs), inputs)


def test_mixed_precision():
    rng = np.random.default_rng(8)
    result = checks.check_mixed_precision(
        lambda dtype: _layer(dtype=dtype), [random_normal(rng, (B, T, D))],
        {"return_memory": True}, policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(result["compressed"].dtype) == "float32"


def test_bad_arguments_and_inputs():
    x = np.zeros((B, T, D), "float32")
    attention = MultiHeadAttention(num_heads=H)
    raises_naming("compressed_length", lambda: CompressiveMemoryAttention(
        attention, memory_length=M, compressed_length=0))
    raises_naming("compression", lambda: _layer("sum"))
    raises_naming("compression_rate", lambda: CompressiveMemoryAttention(
        attention, memory_length=M, compressed_length=N, compression_rate=0))
    raises_naming("compressed_length", lambda: CompressiveMemoryAttention(
        attention, memory_length=M, compressed_length=2, compression="running_mean"))
    layer = _layer()
    layer(x)
    raises_naming("inputs", lambda: layer(np.zeros((B, T, D + 1), "float32")))
    raises_naming("compressed", lambda: layer(x, compressed=np.zeros((B, N + 1, D), "float32")))
    raises_naming("compressed_count", lambda: layer(
        x, compressed=np.zeros((B, N, D), "float32"), compressed_count=np.ones((B, N + 1))))
    raises_naming("compressed", lambda: layer(x, compressed_count=np.ones((B, N))))
    stateful = _layer(stateful=True, batch_size=B)
    stateful(x)
    raises_naming("compressed", lambda: stateful(x, compressed=np.zeros((B, N, D), "float32")))
    raises_naming("batch_size", lambda: stateful.init_cache(B + 1, 8))
