"""RelativePositionBias: T5's bucketed relative position bias (cited in survey §4.1.3)."""

import numpy as np
import pytest

from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RelativePositionBias
from keras_xf.ops import relative_distance
from keras_xf.ops import relative_position_buckets
from tests import layer_checks as checks
from tests.layers.attention import position_checks as pc
from tests.reference import attention as ref_attention
from tests.reference import relative_positions as ref

T = pc.T


@pytest.mark.parametrize(
    "num_buckets,max_distance,bidirectional",
    [(32, 128, True), (32, 128, False), (8, 20, True), (6, 10, False)],
)
def test_buckets_match_reference(num_buckets, max_distance, bidirectional):
    distance = np.arange(-300, 301)
    buckets = checks.to_numpy(
        relative_position_buckets(distance, num_buckets, max_distance, bidirectional)
    )
    expected = [ref.t5_bucket(int(d), num_buckets, max_distance, bidirectional) for d in distance]
    np.testing.assert_array_equal(buckets, expected)
    assert buckets.min() == 0 and buckets.max() == num_buckets - 1


def test_causal_buckets_give_later_keys_bucket_zero():
    buckets = checks.to_numpy(relative_position_buckets(np.arange(-3, 4), 8, 16, False))
    np.testing.assert_array_equal(buckets, [3, 2, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("bidirectional,causal", [(True, False), (False, True)])
def test_matches_reference_inside_attention(rng, bidirectional, causal):
    hook = RelativePositionBias(num_buckets=6, max_distance=8, bidirectional=bidirectional)
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1, biases=[hook])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    assert tuple(hook.embeddings.shape) == (6, 2)
    table = checks.to_numpy(hook.embeddings).astype("float64")
    bias = ref.t5_bias(table, np.arange(T), np.arange(T), 8, bidirectional)
    lengths = [T, 4]
    w = pc.mha_weights(layer)
    expected, _ = ref_attention.multi_head_attention(
        x, x, w, 2, 1, mask=pc.reference_mask(lengths, causal), bias=bias[None]
    )
    pc.check_layer_outputs(layer, x, expected, padding_mask=pc.padding(lengths),
                           use_causal_mask=causal)


def test_bias_of_shifted_positions():
    hook = RelativePositionBias(num_buckets=8, max_distance=16)
    query = np.zeros((1, 3, 2, 4), "float32")
    key = np.zeros((1, 5, 2, 4), "float32")
    bias = checks.to_numpy(hook(query, key, np.arange(3) + 7, np.arange(5) + 5))
    table = checks.to_numpy(hook.embeddings)
    expected = ref.t5_bias(table, np.arange(3) + 7, np.arange(5) + 5, 16, True)
    np.testing.assert_allclose(bias, expected[None], atol=1e-7)
    distance = checks.to_numpy(relative_distance(np.arange(3) + 7, np.arange(5) + 5))
    np.testing.assert_array_equal(distance, np.arange(5)[None] - np.arange(3)[:, None] - 2)


def test_cached_decoding_equals_full_causal_pass(rng):
    hook = RelativePositionBias(num_buckets=6, max_distance=8, bidirectional=False)
    layer = MultiHeadAttention(num_heads=2, biases=[hook])
    x = pc.inputs(rng)
    layer(x)
    pc.randomize(layer, rng)
    pc.check_cached_decoding(layer, x)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    pc.check_mixed_precision(
        lambda **kw: RelativePositionBias(8, 16, bidirectional=False, **kw), rng, policy
    )


def test_config_and_saving(rng, tmp_path):
    hook = RelativePositionBias(8, 16, bidirectional=False, embeddings_initializer="he_normal")
    pc.check_saving(hook, rng, tmp_path)


@checks.xla_only
def test_jit_compile(rng):
    pc.check_jit_compile(RelativePositionBias(8, 16, bidirectional=False), rng)


def test_causal_lm_trains(rng):
    pc.check_causal_lm_trains(RelativePositionBias(8, 16, bidirectional=False), rng)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_buckets": 0}, r"num_buckets=0"),
        ({"num_buckets": 7}, r"even.*num_buckets=7"),
        ({"num_buckets": 1, "bidirectional": False}, r"num_buckets=1"),
        ({"num_buckets": 8, "max_distance": 2}, r"max_distance=2"),
        ({"num_buckets": 8, "max_distance": -1, "bidirectional": False}, r"max_distance=-1"),
        ({"bidirectional": "yes"}, r"bidirectional=yes"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelativePositionBias(**kwargs)


def test_wrong_head_count_raises(rng):
    hook = RelativePositionBias(8, 16)
    hook.build((2, 6, 2, 8))
    with pytest.raises(ValueError, match="built for 2 heads"):
        hook(np.zeros((1, 6, 4, 8), "float32"), None, np.arange(6), np.arange(6))
