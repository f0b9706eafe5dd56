"""A CausalLM of MemoryAttention blocks (Transformer-XL): trained over a stream of chunks with
`fit`, its memory carried from batch to batch; generation continues from the memory, with the
cache and without, and leaves it as it was; saving keeps it."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MemoryAttention
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import TransformerBlock
from tests.layer_checks import to_numpy
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings

B, T, M = 2, 4, 4


def _memory_lm(stateful=True):
    attention = MultiHeadAttention(HEADS, position=RotaryEmbedding())
    mixer = MemoryAttention(attention, memory_length=M, stateful=stateful,
                            batch_size=B if stateful else None)
    block = TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")
    return randomize_embeddings(causal_lm(block=block, num_layers=2, position="none"))


def _mixers(lm):
    return [block.mixer for block in lm.backbone.transformer_stack.blocks]


def _memories(lm):
    return [(to_numpy(m.memory).copy(), to_numpy(m.memory_mask).copy()) for m in _mixers(lm)]


def _stream_batches(rng, chunks=3):
    stream = rng.integers(1, 32, size=(B, chunks * T + 1)).astype("int32")
    inputs = [stream[:, k * T:(k + 1) * T] for k in range(chunks)]
    labels = [stream[:, k * T + 1:(k + 1) * T + 1] for k in range(chunks)]
    return np.concatenate(inputs), np.concatenate(labels)


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    lm = _memory_lm()
    inputs, labels = _stream_batches(rng)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = lm.fit({"token_ids": inputs, "padding_mask": np.ones_like(inputs)}, labels,
                     batch_size=B, shuffle=False, epochs=4, verbose=0)
    return lm, history.history["loss"], inputs


def test_fit_over_a_stream_lowers_the_loss_and_carries_the_memory(trained):
    lm, losses, _ = trained
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    for memory, valid in _memories(lm):
        assert valid.all() and np.abs(memory).max() > 0


def _greedy_without_cache(lm, prompts, new_tokens):
    """Greedy decoding by full passes, each reading the memory and then restoring it."""
    saved = _memories(lm)
    tokens = prompts
    for _ in range(new_tokens):
        logits = lm.predict({"token_ids": tokens, "padding_mask": np.ones_like(tokens)},
                            batch_size=B, verbose=0)
        for mixer, (memory, valid) in zip(_mixers(lm), saved):
            mixer.memory.assign(memory)
            mixer.memory_mask.assign(valid)
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], 1)
    return tokens


def test_generation_continues_from_the_memory_and_leaves_it(trained):
    lm, _, inputs = trained
    before = _memories(lm)
    prompts = inputs[-B:, :3]
    generated = lm.generate(prompts, max_length=7)
    np.testing.assert_array_equal(generated, _greedy_without_cache(lm, prompts, 4))
    for (memory, valid), (after, after_valid) in zip(before, _memories(lm)):
        np.testing.assert_array_equal(after, memory)
        np.testing.assert_array_equal(after_valid, valid)
    with pytest.raises(ValueError, match="carries a memory between calls"):
        lm.generate(prompts, max_length=7, use_cache=False)
    # The memory matters: emptied, the same prompts continue otherwise.
    for mixer in _mixers(lm):
        mixer.reset_memory()
    assert not np.array_equal(lm.generate(prompts, max_length=7), generated)
    for mixer, (memory, valid) in zip(_mixers(lm), before):
        mixer.memory.assign(memory)
        mixer.memory_mask.assign(valid)


def test_saving_keeps_the_memory(trained, tmp_path):
    lm, _, inputs = trained
    path = str(tmp_path / "stream_lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    for (memory, valid), (after, after_valid) in zip(_memories(lm), _memories(loaded)):
        np.testing.assert_array_equal(after, memory)
        np.testing.assert_array_equal(after_valid, valid)
    prompts = inputs[-B:, :3]
    np.testing.assert_array_equal(loaded.generate(prompts, max_length=7),
                                  lm.generate(prompts, max_length=7))


def test_a_rolling_cache_is_refused():
    from keras_xf.layers import LocalPattern

    attention = MultiHeadAttention(HEADS, pattern=LocalPattern(window_left=2))
    layer = MemoryAttention(attention, memory_length=M)
    layer(np.zeros((B, T, 8), "float32"))
    with pytest.raises(ValueError, match="rolling cache"):
        layer.init_cache(B, 8)


def test_stream_memory_starts_every_pass_with_empty_memories(trained):
    from keras_xf.layers.memory import reset_memories
    from keras_xf.training import StreamMemory
    from keras_xf.training import stream_examples

    lm, _, _ = trained
    saved = _memories(lm)
    stream = np.random.default_rng(1).integers(1, 32, size=6 * T * B + B).astype("int32")
    x, y, _ = stream_examples(stream, batch_size=B, chunk_length=T)
    # Evaluating the same stream twice gives the same loss only if each pass starts empty.
    first = lm.evaluate(x, y, batch_size=B, verbose=0, callbacks=[StreamMemory()])
    second = lm.evaluate(x, y, batch_size=B, verbose=0, callbacks=[StreamMemory()])
    carried = lm.evaluate(x, y, batch_size=B, verbose=0)
    assert first == pytest.approx(second, rel=1e-6) and carried != pytest.approx(first)
    history = lm.fit(x, y, batch_size=B, shuffle=False, epochs=1, verbose=0,
                     validation_data=(x, y), callbacks=[StreamMemory()])
    assert np.isfinite(history.history["val_loss"][-1])
    assert reset_memories(lm) == 2
    assert all(not valid.any() for _, valid in _memories(lm))
    for mixer, (memory, valid) in zip(_mixers(lm), saved):
        mixer.memory.assign(memory)
        mixer.memory_mask.assign(valid)
