"""RelativePositionEmbedding: RPR `PE(i,j) = u_{clip(j−i, k_rpr)}` in attention (§4.1.3)."""

import numpy as np
import pytest

from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RelativePositionEmbedding
from keras_xf.ops import clip_relative_distance
from keras_xf.ops import relative_distance
from tests import layer_checks as checks
from tests.layers.attention import position_checks as pc
from tests.reference import relative_positions as ref

T = pc.T


def _tables(hook):
    get = lambda w: None if w is None else checks.to_numpy(w).astype("float64")  # noqa: E731
    return {
        "key_table": get(hook.key_embeddings),
        "query_table": get(hook.query_embeddings),
        "value_table": get(hook.value_embeddings),
    }


def _expected(layer, x, k_rpr, kv_heads, mask):
    w = pc.mha_weights(layer)
    q, k, v = ref.project_heads(x.astype("float64"), w, layer.num_heads, kv_heads)
    context, _ = ref.rpr_attention(q, k, v, k_rpr, mask=mask, **_tables(layer.biases[0]))
    return ref.merge_heads(context, w)


def test_clip_relative_distance_matches_reference():
    distance = relative_distance(np.arange(5) + 3, np.arange(9))
    for k_rpr in (0, 2, 10):
        clipped = checks.to_numpy(clip_relative_distance(distance, k_rpr))
        expected = [[ref.clip(j - i, k_rpr) for j in range(9)] for i in range(3, 8)]
        np.testing.assert_array_equal(clipped, expected)


@pytest.mark.parametrize(
    "use_values,use_queries,kv_heads,causal",
    [
        (False, False, 2, False),  # Shaw et al. without PEᵛ: key term only (fused path)
        (True, False, 2, True),  # Shaw et al.: PEᵏ and PEᵛ
        (False, True, 1, True),  # PEᵠ and PEᵏ, grouped keys (fused path)
        (True, True, 1, False),  # the survey's full form: PEᵠ, PEᵏ, PEᵛ
    ],
)
def test_matches_reference_inside_attention(rng, use_values, use_queries, kv_heads, causal):
    k_rpr = 2
    hook = RelativePositionEmbedding(k_rpr, use_values=use_values, use_queries=use_queries)
    assert hook.has_value_term == use_values
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=kv_heads, biases=[hook])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    lengths = [T, 4]
    expected = _expected(layer, x, k_rpr, kv_heads, pc.reference_mask(lengths, causal))
    pc.check_layer_outputs(layer, x, expected, padding_mask=pc.padding(lengths),
                           use_causal_mask=causal)


def test_scale_and_weight_count(rng):
    hook = RelativePositionEmbedding(3, use_values=True, use_queries=True, scale=0.5)
    layer = MultiHeadAttention(num_heads=2, scale=0.5, biases=[hook])
    x = pc.inputs(rng)
    layer(x)
    assert [tuple(w.shape) for w in hook.weights] == [(7, 8)] * 3  # 2·k_rpr + 1 rows, d_h wide
    pc.randomize(layer, rng)
    w = pc.mha_weights(layer)
    q, k, v = ref.project_heads(x.astype("float64"), w, 2)
    context, _ = ref.rpr_attention(q, k, v, 3, scale=0.5, **_tables(hook))
    pc.check_layer_outputs(layer, x, ref.merge_heads(context, w))


def test_distances_beyond_k_rpr_share_a_vector(rng):
    # With k_rpr = 0 every pair uses u_0: the key term is h_iᵠ·u_0 for all j, which the
    # softmax cancels, and the value term adds u_0ᵛ: attention without positions, plus u_0ᵛ.
    hook = RelativePositionEmbedding(0, use_values=True)
    layer = MultiHeadAttention(num_heads=2, biases=[hook])
    plain = MultiHeadAttention(num_heads=2)
    x = pc.inputs(rng)
    layer(x), plain(x)
    pc.randomize(layer, rng)
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        for a, b in zip(getattr(plain, name).weights, getattr(layer, name).weights):
            a.assign(b)
    u_v = checks.to_numpy(hook.value_embeddings)[0]
    shift = np.einsum("k,hkd->d", u_v, checks.to_numpy(layer.output_dense.kernel))
    np.testing.assert_allclose(
        checks.to_numpy(layer(x)), checks.to_numpy(plain(x)) + shift, atol=1e-5
    )


def test_cached_decoding_equals_full_causal_pass(rng):
    hook = RelativePositionEmbedding(3, use_values=True, use_queries=True)
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1, biases=[hook])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    pc.check_cached_decoding(layer, x)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    pc.check_mixed_precision(
        lambda **kw: RelativePositionEmbedding(2, use_values=True, use_queries=True, **kw),
        rng,
        policy,
    )


def test_config_and_saving(rng, tmp_path):
    hook = RelativePositionEmbedding(
        2, use_values=True, use_queries=True, scale=0.3, embeddings_initializer="he_normal"
    )
    pc.check_saving(hook, rng, tmp_path)


@checks.xla_only
def test_jit_compile(rng):
    pc.check_jit_compile(RelativePositionEmbedding(2, use_values=True, use_queries=True), rng)


def test_causal_lm_trains(rng):
    pc.check_causal_lm_trains(RelativePositionEmbedding(4, use_values=True, use_queries=True), rng)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_distance": -1}, r"k_rpr.*max_distance=-1"),
        ({"max_distance": 2.5}, r"max_distance=2.5"),
        ({"max_distance": 2, "scale": 0.0}, r"scale=0.0"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelativePositionEmbedding(**kwargs)
