"""LocalPattern, ChunkedPattern and StridedPattern (survey §5.1): fields against the survey's
definitions, block-sparse MultiHeadAttention against the dense numpy oracle, the rolling
decoding cache, generation, training, precision, XLA and saving."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import ChunkedPattern
from keras_xf.layers import FeedForward
from keras_xf.layers import LocalPattern
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import StridedPattern
from keras_xf.layers import TransformerBlock
from keras_xf.layers.attention import fast_paths
from keras_xf.models import CausalLM
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.models.tiny import FFN
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import attention as ref_attention
from tests.reference import block_sparse as ref

B, T, D = 2, 11, 16

# Block size 4 for all three (fewer distinct shapes to compile in eager JAX).
PATTERNS = {
    "local": (lambda **kw: LocalPattern(4, 2, **kw), lambda n: ref.local_field(n, 4, 2)),
    "chunked": (lambda **kw: ChunkedPattern(4, **kw), lambda n: ref.chunked_field(n, 4)),
    "strided": (lambda **kw: StridedPattern(4, 2, **kw), lambda n: ref.strided_field(n, 4, 2)),
}


def _dense(pattern, queries, keys):
    return checks.to_numpy(pattern(keras.ops.arange(queries[0], queries[1]),
                                   keras.ops.arange(keys[0], keys[1])))


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of the block-sparse kernel made by MultiHeadAttention."""
    calls = []
    original = fast_paths.block_sparse_attention

    def counting(*args, **kwargs):
        calls.append(kwargs["block_size"])
        return original(*args, **kwargs)

    monkeypatch.setattr(fast_paths, "block_sparse_attention", counting)
    return calls


def test_fields_follow_the_survey_definitions():
    n = 13
    for name, (make, field) in PATTERNS.items():
        np.testing.assert_array_equal(_dense(make(), (0, n), (0, n)), field(n), err_msg=name)
        # Absolute positions: queries 5…8 (as with a cache) see the same rows of the field.
        np.testing.assert_array_equal(_dense(make(), (5, 9), (0, n)), field(n)[5:9])
    # stride = window gives chunked attention, stride = 1 the band |i − j| < window.
    np.testing.assert_array_equal(_dense(StridedPattern(3, 3), (0, n), (0, n)), ref.chunked_field(n, 3))
    np.testing.assert_array_equal(_dense(StridedPattern(3, 1), (0, n), (0, n)), ref.local_field(n, 2, 2))
    np.testing.assert_array_equal(_dense(StridedPattern(5, 3), (0, n), (0, n)), ref.strided_field(n, 5, 3))
    np.testing.assert_array_equal(_dense(LocalPattern(0), (0, n), (0, n)), np.eye(n, dtype=bool))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: LocalPattern(-1), "window_left must be a non-negative int. Received: window_left=-1"),
        (lambda: LocalPattern(2, -3), "window_right must be a non-negative int. Received: window_right=-3"),
        (lambda: LocalPattern(1.5), "window_left must be a non-negative int. Received: window_left=1.5"),
        (lambda: ChunkedPattern(0), "chunk_size must be a positive int. Received: chunk_size=0"),
        (lambda: StridedPattern(0, 1), "window must be a positive int. Received: window=0"),
        (lambda: StridedPattern(4, 0), "stride must be a positive int. Received: stride=0"),
        (lambda: StridedPattern(2, 3), "stride must not exceed window.*window=2, stride=3"),
    ],
)
def test_invalid_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _reference(layer, x, field, padding=None, causal=False):
    w = {name: checks.to_numpy(dense.kernel).astype("float64") for name, dense in
         (("wq", layer.query_dense), ("wk", layer.key_dense), ("wv", layer.value_dense),
          ("wo", layer.output_dense))}
    w.update({name: checks.to_numpy(dense.bias).astype("float64") for name, dense in
              (("bq", layer.query_dense), ("bk", layer.key_dense), ("bv", layer.value_dense),
               ("bo", layer.output_dense))})
    mask = field[None, None]
    if causal:
        mask = mask & ref_attention.causal_mask(x.shape[1])[None, None]
    if padding is not None:
        mask = mask & padding[:, None, None, :]
    out, _ = ref_attention.multi_head_attention(x, x, w, layer.num_heads,
                                                layer.num_key_value_heads, mask=mask)
    return out


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_block_sparse_attention_matches_reference_and_dense_path(rng, spy, name):
    make, field = PATTERNS[name]
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, pattern=make())
    dense = MultiHeadAttention(num_heads=4, num_key_value_heads=2,
                               pattern=make(block_sparse=False))
    x, padding = random_normal(rng, (B, T, D)), padding_mask([T, 6], T)
    layer(x)
    dense(x)
    dense.set_weights(layer.get_weights())
    for causal in (False, True):
        calls = len(spy)
        out = checks.to_numpy(layer(x, padding_mask=padding, use_causal_mask=causal))
        assert len(spy) == calls + 1, "the block-sparse kernel was not used"
        expected = _reference(layer, x, field(T), padding, causal)
        np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(
            checks.to_numpy(dense(x, padding_mask=padding, use_causal_mask=causal)), out,
            atol=1e-5, rtol=1e-5)
        assert len(spy) == calls + 1, "block_sparse=False must take the dense path"


def test_dense_fallback_when_scores_or_masks_are_needed(rng, spy):
    layer = MultiHeadAttention(num_heads=2, pattern=LocalPattern(2), causal=True)
    x = random_normal(rng, (B, T, D))
    sparse = checks.to_numpy(layer(x))
    assert len(spy) == 1
    out, weights = checks.split_scores(layer(x, return_attention_scores=True))
    assert len(spy) == 1
    q = keras.ops.zeros((B, T, 2, 8))
    assert layer._block_sparse_applies(q, None, None, None, None, None, False)
    assert not layer._block_sparse_applies(q, None, None, np.ones((B, T, T), bool), None,
                                           None, False)
    assert not layer._block_sparse_applies(q, x, None, None, None, None, False)  # cross
    assert not MultiHeadAttention(num_heads=2, pattern=LocalPattern(2), biases=[
        AlibiBias()])._block_sparse_applies(q, None, None, None, None, None, False)
    np.testing.assert_allclose(checks.to_numpy(out), sparse, atol=1e-5)
    weights = checks.to_numpy(weights)
    allowed = ref.local_field(T, 2, 0) & ref_attention.causal_mask(T)
    np.testing.assert_array_equal(weights[0, 0] > 0, allowed)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_rolling_cache_decoding_equals_full_causal_pass(rng, name):
    make = PATTERNS[name][0]
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, position=RotaryEmbedding(),
                               pattern=make())
    dense = MultiHeadAttention(num_heads=4, num_key_value_heads=2, position=RotaryEmbedding(),
                               pattern=make(block_sparse=False, rolling_cache=False))
    x = random_normal(rng, (B, T, D))
    expected = checks.to_numpy(layer(x, use_causal_mask=True))
    dense(x)
    dense.set_weights(layer.get_weights())
    np.testing.assert_allclose(checks.to_numpy(dense(x, use_causal_mask=True)), expected,
                               atol=1e-5)
    slots = layer.pattern.cache_slots
    assert tuple(dense.init_cache(B, T)[0].shape) == (B, 2, T, 4)
    prompt = 6  # a prompt longer than the cache, then one token at a time
    cache = layer.init_cache(B, T)
    assert tuple(cache[0].shape) == (B, 2, slots, 4)
    out, cache = layer(x[:, :prompt], use_causal_mask=True, cache=cache, cache_index=0)
    outputs = [checks.to_numpy(out)]
    # Repeating the latest position (as the generation loop does) changes nothing.
    again, cache = layer(x[:, prompt - 1 : prompt], use_causal_mask=True, cache=cache,
                         cache_index=prompt - 1)
    np.testing.assert_allclose(checks.to_numpy(again)[:, 0], outputs[0][:, -1], atol=1e-5)
    for index in range(prompt, T):
        out, cache = layer(x[:, index : index + 1], use_causal_mask=True, cache=cache,
                           cache_index=index)
        assert tuple(cache[0].shape) == (B, 2, slots, 4)
        outputs.append(checks.to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5,
                               rtol=1e-5)
    # A short generation gets a plain cache of its length.
    assert tuple(layer.init_cache(B, 2)[0].shape) == (B, 2, 2, 4)


def test_rolling_cache_refuses_key_masks(rng):
    layer = MultiHeadAttention(num_heads=2, pattern=LocalPattern(2))
    x = random_normal(rng, (B, T, D))
    layer(x)
    cache = layer.init_cache(B, T)
    with pytest.raises(ValueError, match="rolling cache.*padding_mask=True"):
        layer(x[:, :1], padding_mask=np.ones((B, 3), bool), cache=cache, cache_index=0)


def _local_lm(pattern=None):
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=2, pattern=pattern or LocalPattern(2)),
        feedforward=FeedForward(FFN),
        norm_placement="pre",
    )
    return CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                    max_sequence_length=12, position="rotary")


def test_generate_with_a_rolling_cache_equals_uncached_generate():
    keras.utils.set_random_seed(3)
    model = randomize_embeddings(_local_lm(), seed=3)
    caches = model.init_cache(3, 10)
    assert tuple(caches[0][0].shape) == (3, 2, 3, 8)  # window_left + 1 slots
    prompts = [[3, 4, 5], [6, 7], [9, 10, 11, 12, 13]]
    cached = model.generate(prompts, max_length=10)
    assert cached == model.generate(prompts, max_length=10, use_cache=False)
    assert all(len(row) == 10 for row in cached)


@pytest.mark.parametrize(
    "pattern", [lambda: LocalPattern(3), lambda: ChunkedPattern(4), lambda: StridedPattern(4, 2)],
    ids=["local", "chunked", "strided"])
def test_causal_lm_with_banded_pattern_trains(rng, pattern):
    model = _local_lm(pattern())
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    x = token_batch(rng, length=12)
    y = rng.integers(1, VOCAB, size=(2, 12)).astype("int32")
    losses = model.fit(x, y, epochs=4, batch_size=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, spy, policy):
    x = random_normal(rng, (B, T, D))
    out = checks.check_mixed_precision(
        lambda **kw: MultiHeadAttention(num_heads=4, num_key_value_heads=2,
                                        pattern=StridedPattern(4, 2), **kw),
        [x], {"padding_mask": padding_mask([T, 0], T), "use_causal_mask": True}, policy=policy)
    assert spy, "the block-sparse kernel was not used"
    np.testing.assert_array_equal(checks.to_numpy(out)[1], 0.0)  # fully padded row


@checks.xla_only
def test_jit_compile(rng):
    x, padding = random_normal(rng, (B, T, D)), padding_mask([T, 5], T)
    layer = MultiHeadAttention(num_heads=2, pattern=LocalPattern(3), causal=True)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding})
    checks.check_jit_compile(model, [x, padding])


def test_config_and_saving(rng, tmp_path):
    for make, _ in PATTERNS.values():
        checks.check_config_round_trip(make(block_sparse=False, rolling_cache=False))
    layer = MultiHeadAttention(num_heads=2, pattern=ChunkedPattern(4), causal=True, dropout=0.1)
    clone = checks.check_config_round_trip(layer)
    assert isinstance(clone.pattern, ChunkedPattern) and clone.pattern.chunk_size == 4
    x, padding = random_normal(rng, (B, T, D)), padding_mask([T, 7], T)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding})
    loaded = checks.check_saving(model, [x, padding], tmp_path)
    assert isinstance(loaded.layers[-1].pattern, ChunkedPattern)
