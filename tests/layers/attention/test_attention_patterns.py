import keras
import numpy as np
import pytest

from keras_xf.layers import ClusteringPattern
from keras_xf.layers import DilatedPattern
from keras_xf.layers import FeedForward
from keras_xf.layers import GlobalPattern
from keras_xf.layers import HashingPattern
from keras_xf.layers import HybridPattern
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import PerHeadPattern
from keras_xf.layers import RandomPattern
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_numpy
from tests.models.tiny import causal_lm
from tests.models.tiny import token_batch
from tests.reference import attention as ref
from tests.reference import sparse_patterns as ref_patterns

B, T, D, H = 2, 8, 16, 2
QUERY_POSITIONS = np.arange(3, 8)
KEY_POSITIONS = np.arange(10)


def _random_table(pattern):
    return to_numpy(pattern.random_keys)


def _position_cases():
    def random_pattern():
        return RandomPattern(num_random=3, max_length=9, seed=3)

    return {
        "dilated": (
            lambda: DilatedPattern(window=2, dilation=2),
            lambda p, q, k: ref_patterns.dilated_field(q, k, 2, 2),
        ),
        "dilated_causal": (
            lambda: DilatedPattern(window=3, dilation=3, causal=True),
            lambda p, q, k: ref_patterns.dilated_field(q, k, 3, 3, causal=True),
        ),
        "local": (
            lambda: DilatedPattern(window=1),
            lambda p, q, k: np.abs(q[:, None] - k[None, :]) <= 1,
        ),
        "global_positions": (
            lambda: GlobalPattern(global_positions=[4, 0]),
            lambda p, q, k: ref_patterns.global_field(q, k, [0, 4]),
        ),
        "num_global": (
            lambda: GlobalPattern(num_global=2),
            lambda p, q, k: ref_patterns.global_field(q, k, [0, 1]),
        ),
        "random": (
            random_pattern,
            lambda p, q, k: ref_patterns.random_field(q, k, _random_table(p)),
        ),
        "hybrid": (
            lambda: HybridPattern([DilatedPattern(1), GlobalPattern(num_global=1), random_pattern()]),
            lambda p, q, k: ref_patterns.union(
                np.abs(q[:, None] - k[None, :]) <= 1,
                ref_patterns.global_field(q, k, [0]),
                ref_patterns.random_field(q, k, _random_table(p.patterns[2])),
            )[None, None],
        ),
        "per_head": (
            lambda: PerHeadPattern([DilatedPattern(1, causal=True), GlobalPattern(num_global=1)]),
            lambda p, q, k: np.stack(
                [ref_patterns.dilated_field(q, k, 1, 1, causal=True), ref_patterns.global_field(q, k, [0])]
            )[None],
        ),
    }


POSITION_CASES = _position_cases()


@pytest.mark.parametrize("name", sorted(POSITION_CASES))
def test_position_patterns_match_reference(name):
    make, reference = POSITION_CASES[name]
    pattern = make()
    pattern.build((B, T, H, D // H))
    mask = to_numpy(pattern(QUERY_POSITIONS.astype("int32"), KEY_POSITIONS.astype("int32")))
    expected = reference(pattern, QUERY_POSITIONS, KEY_POSITIONS)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, expected)
    assert pattern.uses_states is False and pattern.supports_decoding is True


def test_random_pattern_draw():
    table = _random_table(_built(RandomPattern(num_random=3, max_length=9, seed=3)))
    same = _random_table(_built(RandomPattern(num_random=3, max_length=9, seed=3)))
    np.testing.assert_array_equal(table, same)
    assert all(len(set(row)) == 3 and row.min() >= 0 and row.max() < 9 for row in table)
    causal = _random_table(_built(RandomPattern(num_random=3, max_length=9, seed=3, causal=True)))
    for i, row in enumerate(causal):
        drawn = row[row >= 0]
        assert len(drawn) == min(3, i + 1) and len(set(drawn)) == len(drawn) and drawn.max() <= i
    fresh = [_random_table(_built(RandomPattern(3, 9))) for _ in range(2)]
    assert not np.array_equal(*fresh)


def _built(pattern, heads=H, head_dim=D // H):
    pattern.build((B, T, heads, head_dim))
    return pattern


@pytest.mark.parametrize(
    "make",
    [
        lambda: HashingPattern(num_buckets=4, seed=1),
        lambda: HashingPattern(num_buckets=4, num_hashes=2, seed=1),
        lambda: HashingPattern(num_buckets=6, chunk_size=3, num_hashes=2, seed=1),
        lambda: ClusteringPattern(num_clusters=3, seed=1),
    ],
)
def test_state_patterns_match_reference(rng, make):
    pattern = _built(make())
    query = rng.normal(size=(B, 7, H, D // H)).astype("float32")
    key = rng.normal(size=(B, 9, 1, D // H)).astype("float32")  # one key head shared (GQA)
    mask = to_numpy(pattern(np.arange(7, dtype="int32"), np.arange(9, dtype="int32"), query=query, key=key))
    key = np.repeat(key, H, axis=2)
    if isinstance(pattern, HashingPattern):
        rotations = to_numpy(pattern.rotations).astype("float64")
        expected = ref_patterns.hashing_field(query, key, rotations, pattern.chunk_size)
    else:
        expected = ref_patterns.clustering_field(query, key, to_numpy(pattern.centroids))
    np.testing.assert_array_equal(mask, expected)
    assert 0 < mask.mean() < 1
    assert pattern.uses_states is True
    assert pattern.supports_decoding is (getattr(pattern, "chunk_size", None) is None)


def test_clustering_centroids_follow_moving_average(rng):
    pattern = _built(ClusteringPattern(num_clusters=3, decay=0.9, seed=2))
    query = rng.normal(size=(B, 6, H, D // H)).astype("float32")
    key = rng.normal(size=(B, 6, H, D // H)).astype("float32")
    before = to_numpy(pattern.centroids).astype("float64")
    positions = np.arange(6, dtype="int32")
    pattern(positions, positions, query=query, key=key)
    np.testing.assert_array_equal(to_numpy(pattern.centroids), before)  # inference: unchanged
    pattern(positions, positions, query=query, key=key, training=True)
    expected = ref_patterns.ema_centroids(query, key, before, 0.9)
    np.testing.assert_allclose(to_numpy(pattern.centroids), expected, atol=1e-5)


MHA_PATTERNS = {
    "dilated": lambda: DilatedPattern(window=2, dilation=2),
    "hybrid": lambda: HybridPattern(
        [DilatedPattern(1), GlobalPattern(num_global=1), RandomPattern(2, max_length=T, seed=0)]
    ),
    "per_head": lambda: PerHeadPattern([DilatedPattern(1), GlobalPattern(global_positions=[2])]),
    "hashing": lambda: HashingPattern(num_buckets=4, num_hashes=2, seed=0),
    "hashing_chunked": lambda: HashingPattern(num_buckets=4, chunk_size=3, seed=0),
    "clustering": lambda: ClusteringPattern(num_clusters=2, seed=0),
}


def _mha_weights(layer):
    names = {"wq": layer.query_dense, "wk": layer.key_dense, "wv": layer.value_dense,
             "wo": layer.output_dense}
    w = {k: to_numpy(v.kernel).astype("float64") for k, v in names.items()}
    w.update({k.replace("w", "b"): to_numpy(v.bias).astype("float64") for k, v in names.items()})
    return w


def _reference_pattern_mask(pattern, layer, x, positions):
    """The field from the numpy references, given the layer's projected queries and keys."""
    w = _mha_weights(layer)
    if getattr(pattern, "uses_states", False):
        q = np.einsum("btd,dhk->bthk", x, w["wq"]) + w["bq"]
        k = np.einsum("btd,dhk->bthk", x, w["wk"]) + w["bk"]
        k = np.repeat(k, layer.num_heads // layer.num_key_value_heads, axis=2)
        if isinstance(pattern, HashingPattern):
            return ref_patterns.hashing_field(q, k, to_numpy(pattern.rotations), pattern.chunk_size)
        return ref_patterns.clustering_field(q, k, to_numpy(pattern.centroids))
    if isinstance(pattern, DilatedPattern):
        return ref_patterns.dilated_field(positions, positions, pattern.window, pattern.dilation)
    if isinstance(pattern, PerHeadPattern):
        return np.stack([
            np.abs(positions[:, None] - positions[None, :]) <= 1,
            ref_patterns.global_field(positions, positions, [2]),
        ])[None]
    local, glob, rand = pattern.patterns
    return ref_patterns.union(
        np.abs(positions[:, None] - positions[None, :]) <= 1,
        ref_patterns.global_field(positions, positions, [0]),
        ref_patterns.random_field(positions, positions, _random_table(rand)),
    )


@pytest.mark.parametrize("name", sorted(MHA_PATTERNS))
def test_inside_attention_matches_numpy_attention(rng, name):
    pattern = MHA_PATTERNS[name]()
    kv_heads = 1 if name == "hashing" else H
    layer = MultiHeadAttention(num_heads=H, num_key_value_heads=kv_heads, pattern=pattern)
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([T, 5], T)
    out = to_numpy(layer(x, padding_mask=padding, use_causal_mask=True))
    positions = np.arange(T)
    field = _reference_pattern_mask(pattern, layer, x.astype("float64"), positions)
    mask = field & padding[:, None, None, :] & ref.causal_mask(T)
    expected, _ = ref.multi_head_attention(
        x.astype("float64"), x.astype("float64"), _mha_weights(layer), H, kv_heads, mask=mask
    )
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
    explicit, weights = checks.split_scores(layer(x, padding_mask=padding, use_causal_mask=True, return_attention_scores=True))
    np.testing.assert_allclose(to_numpy(explicit), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(to_numpy(weights)[np.broadcast_to(~mask, weights.shape)], 0.0)


DECODING = {
    "positions": lambda: PerHeadPattern([
        HybridPattern([DilatedPattern(1, dilation=2), GlobalPattern(num_global=1)]),
        HybridPattern([DilatedPattern(1), RandomPattern(2, max_length=T, seed=0)]),
    ]),
    "states": lambda: PerHeadPattern([
        HashingPattern(num_buckets=4, num_hashes=2, seed=0),
        ClusteringPattern(num_clusters=2, seed=0),
    ]),
}


@pytest.mark.parametrize("name", sorted(DECODING))
def test_cached_decoding_equals_full_causal_pass(rng, name):
    layer = MultiHeadAttention(num_heads=H, pattern=DECODING[name]())
    assert layer.pattern.supports_decoding
    x = random_normal(rng, (B, T, D))
    checks.check_cached_decoding(layer, x, prefill=3)


@pytest.mark.parametrize(
    "pattern",
    [
        HashingPattern(num_buckets=4, chunk_size=2, seed=0),
        HybridPattern([DilatedPattern(1), HashingPattern(num_buckets=4, chunk_size=2, seed=0)]),
        PerHeadPattern([DilatedPattern(1), HashingPattern(num_buckets=4, chunk_size=2, seed=0)]),
    ],
)
def test_patterns_that_cannot_decode_refuse_cache_index(rng, pattern):
    assert pattern.supports_decoding is False
    layer = MultiHeadAttention(num_heads=H, pattern=pattern)
    x = random_normal(rng, (B, T, D))
    layer(x, use_causal_mask=True)
    with pytest.raises(ValueError, match="does not support cached decoding"):
        layer(x[:, :1], use_causal_mask=True, cache=layer.init_cache(B, T), cache_index=0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([T, 0], T)
    pattern = PerHeadPattern([
        HybridPattern([DilatedPattern(1), RandomPattern(2, max_length=T, seed=0)], dtype=policy),
        HybridPattern([HashingPattern(4, seed=0), ClusteringPattern(2, seed=0)], dtype=policy),
    ], dtype=policy)
    layer = MultiHeadAttention(num_heads=H, pattern=pattern, dtype=policy)
    out = layer(x, padding_mask=padding, use_causal_mask=True, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    out = to_numpy(out).astype("float32")
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], np.broadcast_to(to_numpy(layer.output_dense.bias), out[1].shape))
    dtypes = {w.name: keras.backend.standardize_dtype(w.dtype) for w in layer.weights}
    assert dtypes.pop("random_keys") == "int32"
    assert set(dtypes.values()) == {"float32"}


def _state_model(pattern, x, padding):
    layer = MultiHeadAttention(num_heads=H, pattern=pattern, causal=True)
    return checks.wrap_in_model(layer, [x], {"padding_mask": padding})


@checks.xla_only
def test_jit_compile_state_patterns(rng):
    x, padding = random_normal(rng, (B, T, D)), padding_mask([T, 5], T)
    pattern = HybridPattern([
        HashingPattern(num_buckets=4, chunk_size=3, num_hashes=2, seed=0),
        ClusteringPattern(num_clusters=2, decay=0.5, seed=0),
    ])
    model = _state_model(pattern, x, padding)
    before = to_numpy(pattern.patterns[1].centroids)
    checks.check_jit_compile(model, [x, padding])
    assert not np.allclose(to_numpy(pattern.patterns[1].centroids), before)  # updated under XLA


def test_config_round_trip_and_saving(rng, tmp_path):
    x, padding = random_normal(rng, (B, T, D)), padding_mask([T, 5], T)
    pattern = PerHeadPattern([
        HybridPattern([DilatedPattern(2, dilation=2, causal=True), GlobalPattern(global_positions=[1]),
                       RandomPattern(2, max_length=T)]),
        HybridPattern([HashingPattern(4, chunk_size=2, num_hashes=2),
                       ClusteringPattern(2, decay=0.5, seed=1)]),
    ])
    layer = MultiHeadAttention(num_heads=H, pattern=pattern, causal=True)
    clone = checks.check_config_round_trip(layer)
    assert clone.pattern.patterns[1].patterns[0].chunk_size == 2
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding})
    checks.check_fit_step(model, [x, padding])
    loaded = checks.check_saving(model, [x, padding], tmp_path, atol=1e-5)
    # The unseeded draws (random keys, rotations) and the moved centroids come back exactly.
    for name in ("random_keys", "rotations", "centroids"):
        saved = [w for w in model.weights if w.name == name]
        restored = [w for w in loaded.weights if w.name == name]
        assert len(saved) == len(restored) == 1
        np.testing.assert_array_equal(to_numpy(restored[0]), to_numpy(saved[0]))


@pytest.mark.parametrize(
    "pattern",
    [
        lambda: HybridPattern([DilatedPattern(1, causal=True), GlobalPattern(num_global=1),
                               RandomPattern(2, max_length=12, seed=0, causal=True)]),
        lambda: HashingPattern(num_buckets=4, num_hashes=2, seed=0),
        lambda: PerHeadPattern([DilatedPattern(2, dilation=2, causal=True),
                                GlobalPattern(global_positions=[0, 3])]),
        lambda: ClusteringPattern(num_clusters=2, seed=0),
    ],
    ids=["hybrid_local_global_random", "hashing", "per_head_dilated_global", "clustering"],
)
def test_causal_lm_trains(rng, pattern):
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=H, pattern=pattern()),
        feedforward=FeedForward(hidden_dim=32),
    )
    model = causal_lm(num_layers=1, block=block)
    x = token_batch(rng)
    y = np.roll(x["token_ids"], -1, axis=1)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    history = model.fit(x, y, epochs=4, batch_size=2, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    logits = to_numpy(model(x))
    assert np.all(np.isfinite(logits))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: DilatedPattern(window=0), "window must be a positive int. Received: window=0"),
        (lambda: DilatedPattern(window=2, dilation=0), "dilation must be .* Received: dilation=0"),
        (lambda: DilatedPattern(window=-1), "Received: window=-1"),
        (lambda: GlobalPattern(), "exactly one of global_positions and num_global"),
        (lambda: GlobalPattern(global_positions=[-1]), "Received: global_positions=\\[-1\\]"),
        (lambda: GlobalPattern(num_global=0), "Received: num_global=0"),
        (lambda: RandomPattern(num_random=0, max_length=4), "Received: num_random=0"),
        (lambda: RandomPattern(num_random=1, max_length=0), "Received: max_length=0"),
        (lambda: HashingPattern(num_buckets=1), "num_buckets must be an int >= 2. Received: num_buckets=1"),
        (lambda: HashingPattern(num_buckets=5), "num_buckets must be even .*Received: num_buckets=5"),
        (lambda: HashingPattern(num_buckets=4, chunk_size=0), "Received: chunk_size=0"),
        (lambda: ClusteringPattern(num_clusters=1), "Received: num_clusters=1"),
        (lambda: ClusteringPattern(num_clusters=2, decay=1.0), "Received: decay=1.0"),
        (lambda: HybridPattern([]), "patterns must be a non-empty list"),
        (lambda: PerHeadPattern(["local"]), "patterns\\[0\\] must be a Keras layer"),
        (lambda: HybridPattern([DilatedPattern(1), FeedForward(4)]),
         "patterns\\[1\\] must be an instance of AttentionPattern"),
    ],
)
def test_bad_configs_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_pattern_head_count_mismatch_raises(rng):
    pattern = PerHeadPattern([DilatedPattern(1), GlobalPattern(num_global=1), DilatedPattern(2)])
    with pytest.raises(ValueError, match="one pattern per attention head. Received: 3 patterns for num_heads=2"):
        MultiHeadAttention(num_heads=H, pattern=pattern)(random_normal(rng, (B, T, D)))
