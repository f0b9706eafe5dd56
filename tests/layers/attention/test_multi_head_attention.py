import keras
import numpy as np
import pytest

from keras_xf.layers import AttentionPattern
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import ScoreBias
from keras_xf.layers import ScoreMultiplier
from tests import layer_checks as checks
from tests.layer_checks import attention_weights
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.reference import attention as ref
from tests.reference import positions as ref_positions

B, T, S, D = 2, 5, 6, 16


# Hook layers exercising the score-pipeline plug points (real variants arrive as library layers).
@keras.saving.register_keras_serializable(package="keras_xf_tests")
class DistanceBias(ScoreBias):
    """Additive bias `-slope_h · |i − j|` per head; optional value term `Σ_j α_ij · c·(j−i)`."""

    def __init__(self, num_heads, with_value_term=False, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.has_value_term = with_value_term

    def call(self, query, key, query_positions, key_positions):
        distance = keras.ops.abs(query_positions[:, None] - key_positions[None, :])
        slopes = keras.ops.arange(1, self.num_heads + 1, dtype="float32") / self.num_heads
        return -slopes[:, None, None] * keras.ops.cast(distance, "float32")[None]

    def value_term(self, weights, value, query_positions, key_positions):
        offset = keras.ops.cast(key_positions[None, :] - query_positions[:, None], "float32")
        per_head = keras.ops.sum(weights * offset[None, None], axis=-1)  # [B, H, T]
        term = keras.ops.transpose(per_head, (0, 2, 1))[..., None] * 0.1  # [B, T, H, 1]
        return keras.ops.broadcast_to(term, keras.ops.shape(term)[:3] + (value.shape[-1],))

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "with_value_term": self.has_value_term})
        return config


@keras.saving.register_keras_serializable(package="keras_xf_tests")
class ScaleMultiplier(ScoreMultiplier):
    def call(self, query, key, query_positions, key_positions):
        i = keras.ops.cast(query_positions[:, None], "float32")
        j = keras.ops.cast(key_positions[None, :], "float32")
        return 1.0 / (1.0 + 0.1 * keras.ops.abs(i - j))


@keras.saving.register_keras_serializable(package="keras_xf_tests")
class WindowPattern(AttentionPattern):
    def __init__(self, window=2, **kwargs):
        super().__init__(**kwargs)
        self.window = window

    def call(self, query_positions, key_positions, query=None, key=None):
        distance = keras.ops.abs(query_positions[:, None] - key_positions[None, :])
        return distance <= self.window

    def get_config(self):
        return {**super().get_config(), "window": self.window}


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"num_heads": 4}, 4 * (D * D + D)),
        ({"num_heads": 4, "use_bias": False}, 4 * D * D),
        ({"num_heads": 4, "num_key_value_heads": 2}, 2 * (D * D + D) + 2 * (D * 8 + 8)),
        ({"num_heads": 4, "num_key_value_heads": 1, "use_bias": False}, 2 * D * D + 2 * D * 4),
        ({"num_heads": 2, "head_dim": 4, "output_dim": 8}, 3 * (D * 8 + 8) + 8 * 8 + 8),
        # Qwen2's layout: query, key and value biases, no output bias (and the inverse).
        ({"num_heads": 4, "output_bias": False}, 3 * (D * D + D) + D * D),
        ({"num_heads": 4, "use_bias": False, "output_bias": True}, 4 * D * D + D),
    ],
)
def test_exact_weight_count(rng, kwargs, expected):
    layer = MultiHeadAttention(**kwargs)
    layer(random_normal(rng, (B, T, D)))
    assert checks.count_params(layer) == expected


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_reference(rng, kv_heads, causal):
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=kv_heads)
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 3], T)
    layer(x)
    randomize_weights(layer, rng)
    mask = padding[:, None, None, :]
    if causal:
        mask = mask & ref.causal_mask(T)[None, None]
    expected, expected_weights = ref.multi_head_attention(
        x, x, attention_weights(layer), 4, kv_heads, mask=mask
    )
    out = layer(x, padding_mask=padding, use_causal_mask=causal)
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    out, weights = checks.split_scores(layer(x, padding_mask=padding, use_causal_mask=causal, return_attention_scores=True))
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(weights), expected_weights, atol=1e-5)


def test_cross_attention_matches_reference(rng):
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1)
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, 12))
    padding = padding_mask([6, 2], S)
    attention_mask = rng.random((B, T, S)) > 0.2
    layer(x, memory)
    randomize_weights(layer, rng)
    mask = padding[:, None, None, :] & attention_mask[:, None]
    expected, _ = ref.multi_head_attention(x, memory, attention_weights(layer), 2, 1, mask=mask)
    out = layer(x, memory, padding_mask=padding, attention_mask=attention_mask)
    assert out.shape == (B, T, D)
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)


def test_constructor_causal_flag_is_the_default(rng):
    x = random_normal(rng, (B, T, D))
    layer = MultiHeadAttention(num_heads=2, causal=True)
    causal = checks.to_numpy(layer(x))
    np.testing.assert_allclose(causal, checks.to_numpy(layer(x, use_causal_mask=True)), atol=1e-6)
    assert not np.allclose(causal, checks.to_numpy(layer(x, use_causal_mask=False)), atol=1e-4)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("rotary", [False, True])
def test_cached_decoding_equals_full_causal_pass(rng, kv_heads, rotary):
    layer = MultiHeadAttention(
        num_heads=4, num_key_value_heads=kv_heads, position=RotaryEmbedding() if rotary else None
    )
    x = random_normal(rng, (B, T, D))
    # Prefill two tokens, then one token at a time.
    checks.check_cached_decoding(layer, x, prefill=2, cache_length=T + 2)
    assert [tuple(part.shape) for part in layer.init_cache(B, T + 2)] == [(B, kv_heads, T + 2, D // 4)] * 2


@pytest.mark.parametrize("index", [0, "tensor"])
def test_a_prefill_attends_to_its_own_keys_only(rng, index):
    # A prefill from position 0 (a Python 0: the keys it writes alone; a tensor: the whole
    # cache, masked past the written keys) over a cache whose later slots hold stale
    # entries gives the full causal pass and writes the prompt's keys in place.
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, position=RotaryEmbedding())
    x = random_normal(rng, (B, T, D))
    full = checks.to_numpy(layer(x, use_causal_mask=True))
    stale = tuple(keras.ops.ones_like(part) * 7.0 for part in layer.init_cache(B, T + 3))
    cache_index = 0 if index == 0 else keras.ops.convert_to_tensor(0, "int32")
    out, cache = layer(x, cache=stale, cache_index=cache_index, use_causal_mask=True)
    np.testing.assert_allclose(checks.to_numpy(out), full, atol=1e-5)
    _, reference = layer(x, cache=layer.init_cache(B, T + 3), use_causal_mask=True,
                         cache_index=keras.ops.convert_to_tensor(0, "int32"))
    for part, expected in zip(cache, reference):
        np.testing.assert_allclose(checks.to_numpy(part)[:, :, :T],
                                   checks.to_numpy(expected)[:, :, :T], atol=1e-6)
        np.testing.assert_array_equal(checks.to_numpy(part)[:, :, T:], 7.0)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_cross_attention_cache_is_computed_once(rng, kv_heads):
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=kv_heads)
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))
    padding = padding_mask([6, 4], S)
    full = checks.to_numpy(layer(x, memory, padding_mask=padding))
    cache = layer.init_cache(B, S)
    out, cache = layer(x[:, :1], memory, padding_mask=padding, cache=cache)
    outputs = [checks.to_numpy(out)]
    for index in range(1, T):
        out, same_cache = layer(x[:, index : index + 1], padding_mask=padding, cache=cache)
        np.testing.assert_array_equal(checks.to_numpy(same_cache), checks.to_numpy(cache))
        outputs.append(checks.to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_rotary_position_hook_matches_reference(rng):
    layer = MultiHeadAttention(num_heads=2, position=RotaryEmbedding(max_wavelength=100.0))
    x = random_normal(rng, (B, T, D))
    layer(x)
    w = attention_weights(layer)
    q = np.einsum("btd,dhk->bthk", x, w["wq"]) + w["bq"]
    k = np.einsum("btd,dhk->bthk", x, w["wk"]) + w["bk"]
    v = np.einsum("btd,dhk->bthk", x, w["wv"]) + w["bv"]
    q = ref_positions.rotary(q, np.arange(T), base=100.0)
    k = ref_positions.rotary(k, np.arange(T), base=100.0)
    context, _ = ref.qkv_attention(*(np.transpose(a, (0, 2, 1, 3)) for a in (q, k, v)))
    expected = np.einsum("bhtk,hkd->btd", context, w["wo"]) + w["bo"]
    np.testing.assert_allclose(checks.to_numpy(layer(x)), expected, atol=1e-4, rtol=1e-4)


def _reference_with_hooks(layer, x, bias=None, multiplier=None, pattern=None, value_scale=None):
    w = attention_weights(layer)
    heads = layer.num_heads
    q = np.einsum("btd,dhk->bhtk", x, w["wq"]) + w["bq"][None, :, None]
    k = np.einsum("btd,dhk->bhtk", x, w["wk"]) + w["bk"][None, :, None]
    v = np.einsum("btd,dhk->bhtk", x, w["wv"]) + w["bv"][None, :, None]
    scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(q.shape[-1])
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    if bias:
        scores = scores - (np.arange(1, heads + 1) / heads)[:, None, None] * np.abs(i - j)
    if multiplier:
        scores = scores * (1.0 / (1.0 + 0.1 * np.abs(i - j)))
    mask = None if pattern is None else np.abs(i - j) <= pattern
    alpha = ref.softmax_with_mask(scores, mask)
    context = np.einsum("bhts,bhsk->bhtk", alpha, v)
    if value_scale:
        context = context + value_scale * np.sum(alpha * (j - i), axis=-1)[..., None]
    return np.einsum("bhtk,hkd->btd", context, w["wo"]) + w["bo"]


@pytest.mark.parametrize(
    "hooks,reference_kwargs",
    [
        ({"biases": [DistanceBias(2)]}, {"bias": True}),
        ({"multiplier": ScaleMultiplier()}, {"multiplier": True}),
        ({"pattern": WindowPattern(1)}, {"pattern": 1}),
        ({"biases": [DistanceBias(2, with_value_term=True)]}, {"bias": True, "value_scale": 0.1}),
        (
            {"biases": [DistanceBias(2)], "multiplier": ScaleMultiplier(), "pattern": WindowPattern(2)},
            {"bias": True, "multiplier": True, "pattern": 2},
        ),
    ],
)
def test_score_pipeline_hooks_match_reference(rng, hooks, reference_kwargs):
    layer = MultiHeadAttention(num_heads=2, **hooks)
    x = random_normal(rng, (B, T, D))
    out = checks.to_numpy(layer(x))
    expected = _reference_with_hooks(layer, x, **reference_kwargs)
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
    explicit, _ = checks.split_scores(layer(x, return_attention_scores=True))
    np.testing.assert_allclose(checks.to_numpy(explicit), expected, atol=1e-4, rtol=1e-4)


def test_hooks_survive_config_and_saving(rng, tmp_path):
    layer = MultiHeadAttention(
        num_heads=2,
        num_key_value_heads=1,
        position=RotaryEmbedding(),
        biases=[DistanceBias(2, with_value_term=True)],
        multiplier=ScaleMultiplier(),
        pattern=WindowPattern(2),
    )
    clone = checks.check_config_round_trip(layer)
    assert isinstance(clone.position, RotaryEmbedding) and isinstance(clone.pattern, WindowPattern)
    assert clone.biases[0].has_value_term
    x = random_normal(rng, (B, T, D))
    model = checks.wrap_in_model(layer, [x])
    checks.check_saving(model, [x], tmp_path, atol=1e-5)


def test_config_round_trip_and_fit_and_saving(rng, tmp_path):
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, dropout=0.1, causal=True)
    checks.check_config_round_trip(layer)
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 2], T)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding})
    checks.check_config_round_trip(layer)  # built: head_dim resolved, still round-trips
    checks.check_fit_step(model, [x, padding])
    checks.check_saving(model, [x, padding], tmp_path)


def test_cross_attention_in_a_functional_model(rng, tmp_path):
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, 12))
    model = checks.wrap_in_model(MultiHeadAttention(num_heads=2), [x, memory])
    checks.check_fit_step(model, [x, memory])
    checks.check_saving(model, [x, memory], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 0], T)
    out = checks.check_mixed_precision(
        lambda **kw: MultiHeadAttention(num_heads=4, num_key_value_heads=2, **kw),
        [x],
        {"padding_mask": padding, "use_causal_mask": True},
        policy=policy,
    )
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    out, weights = checks.split_scores(MultiHeadAttention(num_heads=2, dtype=policy)(
        x, padding_mask=padding, return_attention_scores=True
    ))
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    np.testing.assert_array_equal(checks.to_numpy(weights)[1], 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_padded_sequence_is_finite(rng, dtype):
    layer = MultiHeadAttention(num_heads=2, dtype=dtype)
    x = keras.ops.cast(random_normal(rng, (B, T, D)), dtype)
    padding = np.zeros((B, T), bool)
    for kwargs in ({}, {"return_attention_scores": True}, {"use_causal_mask": True}):
        out = layer(x, padding_mask=padding, **kwargs)
        out = out["outputs"] if isinstance(out, dict) else out
        assert np.all(np.isfinite(checks.to_numpy(keras.ops.cast(out, "float32"))))


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 3], T)
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, position=RotaryEmbedding())
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding, "use_causal_mask": True})
    checks.check_jit_compile(model, [x, padding])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_heads": 0}, "num_heads=0"),
        ({"num_heads": 4, "num_key_value_heads": 3}, "num_heads=4, num_key_value_heads=3"),
        ({"num_heads": 4, "dropout": -0.1}, "dropout=-0.1"),
        ({"num_heads": 4, "head_dim": -2}, "head_dim=-2"),
        ({"num_heads": 4, "output_bias": "no"}, "output_bias must be a bool"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_inputs_raise(rng):
    with pytest.raises(ValueError, match="num_heads=5, hidden_dim=16"):
        MultiHeadAttention(num_heads=5)(random_normal(rng, (B, T, D)))
    with pytest.raises(ValueError, match="rank 3"):
        MultiHeadAttention(num_heads=2)(rng.normal(size=(2, 16)).astype("float32"))
    layer = MultiHeadAttention(num_heads=2)
    layer(random_normal(rng, (B, T, D)))
    with pytest.raises(ValueError, match="width 8"):
        layer(random_normal(rng, (B, T, 8)))
    with pytest.raises(ValueError, match="init_cache needs head_dim"):
        MultiHeadAttention(num_heads=2).init_cache(1, 4)
