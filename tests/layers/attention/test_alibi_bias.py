"""AlibiBias: the linear distance penalty `−m_h·|i − j|` (ALiBi, cited in survey §7)."""

import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import MultiHeadAttention
from keras_xf.ops import alibi_slopes
from tests import layer_checks as checks
from tests.layers.attention import position_checks as pc
from tests.reference import attention as ref_attention
from tests.reference import relative_positions as ref

T = pc.T


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_slopes_match_reference(num_heads):
    np.testing.assert_allclose(
        checks.to_numpy(alibi_slopes(num_heads)), ref.alibi_slopes(num_heads), rtol=1e-6
    )


def test_slopes_are_the_geometric_sequence():
    np.testing.assert_allclose(
        checks.to_numpy(alibi_slopes(8)), 2.0 ** (-np.arange(1, 9)), rtol=1e-7
    )
    np.testing.assert_allclose(
        checks.to_numpy(alibi_slopes(4, max_bias=4.0)), 2.0 ** (-np.arange(1, 5.0)), rtol=1e-7
    )


@pytest.mark.parametrize("num_heads,kv_heads,causal", [(2, 2, True), (4, 1, False)])
def test_matches_reference_inside_attention(rng, num_heads, kv_heads, causal):
    layer = MultiHeadAttention(num_heads=num_heads, num_key_value_heads=kv_heads,
                               biases=[AlibiBias()])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    lengths = [T, 4]
    bias = ref.alibi_bias(num_heads, np.arange(T), np.arange(T))
    expected, _ = ref_attention.multi_head_attention(
        x, x, pc.mha_weights(layer), num_heads, kv_heads,
        mask=pc.reference_mask(lengths, causal), bias=bias[None],
    )
    pc.check_layer_outputs(layer, x, expected, padding_mask=pc.padding(lengths),
                           use_causal_mask=causal)


def test_causal_pairs_get_minus_slope_times_distance():
    query = np.zeros((1, 4, 3, 2), "float32")
    bias = checks.to_numpy(AlibiBias()(query, query, np.arange(4) + 5, np.arange(9)))
    slopes = np.asarray(ref.alibi_slopes(3))
    i, j = np.arange(4)[:, None] + 5, np.arange(9)[None, :]
    causal = j <= i
    expected = -slopes[:, None, None] * (i - j)[None]
    np.testing.assert_allclose(bias[0][:, causal], expected[:, causal], rtol=1e-6)
    np.testing.assert_allclose(bias[0], -slopes[:, None, None] * np.abs(i - j)[None], rtol=1e-6)


def test_cached_decoding_equals_full_causal_pass(rng):
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, biases=[AlibiBias()])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    pc.check_cached_decoding(layer, x)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    pc.check_mixed_precision(lambda **kw: AlibiBias(**kw), rng, policy)


def test_config_and_saving(rng, tmp_path):
    hook = AlibiBias(max_bias=6.0)
    assert hook.weights == []
    pc.check_saving(hook, rng, tmp_path)


@checks.xla_only
def test_jit_compile(rng):
    pc.check_jit_compile(AlibiBias(), rng)


def test_causal_lm_trains(rng):
    model = pc.check_causal_lm_trains(AlibiBias(), rng)
    # ALiBi is the only position signal: `a b c` and `b a c` differ at `c` only by order.
    tokens = np.array([[7, 9, 11], [9, 7, 11]], "int32")
    logits = checks.to_numpy(model({"token_ids": tokens, "padding_mask": np.ones_like(tokens)}))
    assert not np.allclose(logits[0, 2], logits[1, 2], atol=1e-4)


def test_greedy_generation_equals_the_full_pass(rng):
    # The compiled decoding step (traced on PyTorch, where shapes become tensors) keeps the
    # head count of the slopes static.
    model = pc.check_causal_lm_trains(AlibiBias(), rng)
    prompt = np.array([[7, 9, 11, 5]], "int32")
    generated = np.asarray(model.generate(
        {"token_ids": np.pad(prompt, [(0, 0), (0, 4)]),
         "padding_mask": np.pad(np.ones_like(prompt), [(0, 0), (0, 4)])},
        stop_token_ids=None)["token_ids"])
    tokens = prompt
    for _ in range(4):
        logits = checks.to_numpy(model({"token_ids": tokens,
                                        "padding_mask": np.ones_like(tokens)}))
        tokens = np.concatenate([tokens, logits[:, -1:].argmax(-1).astype("int32")], axis=1)
    np.testing.assert_array_equal(generated, tokens)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"max_bias": 0}, r"max_bias=0"), ({"max_bias": -8.0}, r"max_bias=-8.0")],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlibiBias(**kwargs)


@pytest.mark.parametrize("num_heads", [0, -2, 2.0])
def test_bad_slope_head_counts_raise(num_heads):
    with pytest.raises(ValueError, match=f"num_heads={num_heads}"):
        alibi_slopes(num_heads)
