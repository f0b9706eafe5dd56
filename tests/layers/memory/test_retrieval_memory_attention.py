"""RetrievalMemoryAttention (survey §5.2.3, a kNN memory): chunks against the numpy
recurrence, the stateful memory in predict and fit, resets, decoding that retrieves from a copy
of the memory, a CausalLM that generates from it, gradients, precision, XLA, saving and wrong
inputs."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RetrievalMemoryAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import TransformerBlock
from keras_xf.layers.memory import reset_memories
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

B, T, S, P, D, H = 2, 3, 5, 2, 8, 2


def _layer(position=None, **kwargs):
    return RetrievalMemoryAttention(MultiHeadAttention(num_heads=H, position=position),
                                    memory_length=S, top_k=P, **kwargs)


def _built(rng, **kwargs):
    layer = _layer(**kwargs)
    layer(np.zeros((B, T, D), "float32"))
    checks.randomize_weights(layer.attention, rng)
    checks.randomize_weights(layer.retrieval, rng)
    layer.gate.assign(rng.normal(size=(D,)).astype("float32"))
    return layer


def _chunks(rng, count=3):
    return [random_normal(rng, (B, T, D)) for _ in range(count)]


def test_chunks_equal_the_numpy_recurrence():
    # Three chunks of 3 into a memory of 5: the memory overflows at the third chunk.
    rng = np.random.default_rng(0)
    layer = _built(rng)
    chunks = _chunks(rng)
    masks = [np.ones((B, T), bool), padding_mask([T, 1], T), np.ones((B, T), bool)]
    expected, last_memory, last_valid = ref.retrieval_memory_attention(
        chunks, checks.attention_weights(layer.attention),
        checks.attention_weights(layer.retrieval), to_numpy(layer.gate), H, S, P, masks)
    memory = memory_mask = None
    for chunk, mask, want in zip(chunks, masks, expected):
        result = layer(chunk, padding_mask=mask, memory=memory, memory_mask=memory_mask,
                       return_memory=True)
        np.testing.assert_allclose(to_numpy(result["outputs"]), want, atol=1e-5, rtol=1e-5)
        memory, memory_mask = result["memory"], result["memory_mask"]
    np.testing.assert_allclose(to_numpy(memory), last_memory, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(memory_mask), last_valid)


def test_a_stateful_layer_carries_the_store_and_resets_it():
    rng = np.random.default_rng(1)
    explicit = _built(rng)
    stateful = _layer(stateful=True, batch_size=B)
    stateful(np.zeros((B, T, D), "float32"))
    stateful.reset_memory()
    stateful.attention.set_weights(explicit.attention.get_weights())
    stateful.retrieval.set_weights(explicit.retrieval.get_weights())
    stateful.gate.assign(explicit.gate)
    memory = valid = None
    for chunk in _chunks(rng):
        result = explicit(chunk, memory=memory, memory_mask=valid, return_memory=True)
        memory, valid = result["memory"], result["memory_mask"]
        np.testing.assert_allclose(to_numpy(stateful(chunk)), to_numpy(result["outputs"]),
                                   atol=1e-6)
    np.testing.assert_allclose(to_numpy(stateful.memory), to_numpy(memory), atol=1e-6)
    chunk = _chunks(rng, 1)[0]
    fresh = to_numpy(explicit(chunk))
    carried = to_numpy(explicit(chunk, memory=memory, memory_mask=valid))
    reset = to_numpy(stateful(chunk, reset=np.array([True, False])))
    np.testing.assert_allclose(reset[0], fresh[0], atol=1e-6)
    np.testing.assert_allclose(reset[1], carried[1], atol=1e-6)
    assert reset_memories(stateful) == 1
    np.testing.assert_allclose(to_numpy(stateful(chunk)), fresh, atol=1e-6)


def test_decoding_retrieves_from_the_store_as_one_pass_does():
    rng = np.random.default_rng(2)
    layer = _built(rng, position=RotaryEmbedding(), stateful=True, batch_size=B)
    for chunk in _chunks(rng, 2):
        layer(chunk)
    memory, valid = to_numpy(layer.memory).copy(), to_numpy(layer.memory_mask).copy()
    chunk = _chunks(rng, 1)[0]
    cache = layer.init_cache(B, T)
    decoded = []
    for t in range(T):
        outputs, cache = layer(chunk[:, t:t + 1], cache=cache, cache_index=t)
        decoded.append(to_numpy(outputs))
    np.testing.assert_array_equal(to_numpy(layer.memory), memory)
    np.testing.assert_array_equal(to_numpy(layer.memory_mask), valid)
    np.testing.assert_allclose(np.concatenate(decoded, axis=1), to_numpy(layer(chunk)),
                               atol=1e-5, rtol=1e-5)


def test_a_causal_lm_trains_over_a_stream_and_generates_from_its_store():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(3)
    attention = MultiHeadAttention(HEADS, position=RotaryEmbedding())
    mixer = RetrievalMemoryAttention(attention, memory_length=8, top_k=P, stateful=True,
                                     batch_size=B)
    block = TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")
    lm = randomize_embeddings(causal_lm(block=block, num_layers=2, position="none"))
    mixers = [block.mixer for block in lm.backbone.transformer_stack.blocks]
    stream = rng.integers(1, 32, size=(B, 3 * 4 + 1)).astype("int32")
    inputs = np.concatenate([stream[:, k * 4:(k + 1) * 4] for k in range(3)])
    labels = np.concatenate([stream[:, k * 4 + 1:(k + 1) * 4 + 1] for k in range(3)])
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = lm.fit({"token_ids": inputs, "padding_mask": np.ones_like(inputs)}, labels,
                     batch_size=B, shuffle=False, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert all(np.abs(to_numpy(m.gate)).max() > 0 for m in mixers)  # the gate trained
    saved = [(to_numpy(m.memory).copy(), to_numpy(m.memory_mask).copy()) for m in mixers]
    assert all(valid.all() for _, valid in saved)
    prompts = inputs[-B:, :3]
    generated = lm.generate(prompts, max_length=7)
    tokens = prompts  # greedy full passes, each reading the memory and restoring it
    for _ in range(4):
        logits = lm.predict({"token_ids": tokens, "padding_mask": np.ones_like(tokens)},
                            batch_size=B, verbose=0)
        for mixer, (memory, valid) in zip(mixers, saved):
            mixer.memory.assign(memory)
            mixer.memory_mask.assign(valid)
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], 1)
    np.testing.assert_array_equal(generated, tokens)
    for mixer, (memory, _) in zip(mixers, saved):
        np.testing.assert_array_equal(to_numpy(mixer.memory), memory)


def test_no_gradient_flows_into_the_store():
    rng = np.random.default_rng(4)
    layer = _built(rng)
    chunk, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))

    def loss(x, s):
        return keras.ops.sum(layer(x, memory=s) ** 2)

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
                    memory=np.zeros((B, S, D), "float32"), memory_mask=np.zeros((B, S), bool))
    assert np.isfinite(to_numpy(outputs)).all()


def test_config_round_trip_and_saving(tmp_path):
    rng = np.random.default_rng(6)
    layer = _built(rng, position=RotaryEmbedding())
    checks.check_config_round_trip(layer)
    checks.check_config_round_trip(_layer(stateful=True, batch_size=B))
    inputs = [random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))]
    model = checks.wrap_in_model(layer, inputs[:1], {"memory": inputs[1]})
    checks.check_saving(model, inputs, tmp_path)


@checks.xla_only
def test_jit_compile():
    inputs = [random_normal(np.random.default_rng(7), (B, T, D))]
    checks.check_jit_compile(checks.wrap_in_model(_layer(), inputs), inputs)


def test_mixed_precision():
    rng = np.random.default_rng(8)
    checks.check_mixed_precision(
        lambda dtype: _layer(dtype=dtype), [random_normal(rng, (B, T, D))],
        {"memory": random_normal(rng, (B, S, D))}, policy="mixed_bfloat16")


def test_bad_arguments_and_inputs():
    x = np.zeros((B, T, D), "float32")
    attention = MultiHeadAttention(num_heads=H)
    raises_naming("memory_length", lambda: RetrievalMemoryAttention(attention, 0, 1))
    raises_naming("top_k", lambda: RetrievalMemoryAttention(attention, S, 0))
    raises_naming("top_k", lambda: RetrievalMemoryAttention(attention, S, S + 1))
    raises_naming("batch_size", lambda: _layer(stateful=True))
    raises_naming("batch_size", lambda: _layer(batch_size=B))
    raises_naming("attention", lambda: RetrievalMemoryAttention(keras.layers.Dense(4), S, P))
    layer = _layer()
    layer(x)
    raises_naming("inputs", lambda: layer(np.zeros((B, T, D + 1), "float32")))
    raises_naming("memory", lambda: layer(x, memory=np.zeros((B, S + 1, D), "float32")))
    raises_naming("memory_mask", lambda: layer(x, memory=np.zeros((B, S, D), "float32"),
                                              memory_mask=np.ones((B, S + 1), bool)))
    raises_naming("memory", lambda: layer(x, memory_mask=np.ones((B, S), bool)))
    raises_naming("reset", lambda: layer(x, reset=np.ones((B + 1,), bool)))
    raises_naming("use_causal_mask", lambda: layer(x, use_causal_mask=False))
    raises_naming("stateful", layer.reset_memory)
    stateful = _layer(stateful=True, batch_size=B)
    stateful(x)
    raises_naming("batch_size", lambda: stateful(np.zeros((B + 1, T, D), "float32")))
    raises_naming("memory", lambda: stateful(x, memory=np.zeros((B, S, D), "float32")))
    raises_naming("batch_size", lambda: stateful.init_cache(B + 1, 8))
