"""block_sparse_attention against the dense numpy oracle of survey §5.1 (tests/reference)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import ChunkedPattern
from keras_xf.layers import LocalPattern
from keras_xf.layers import StridedPattern
from keras_xf.ops import block_sparse_attention
from tests.reference import block_sparse as ref

T = 11  # not a multiple of any block size below

PATTERNS = [
    (LocalPattern(3, 0), ref.local_field(T, 3, 0)),
    (LocalPattern(4, 2), ref.local_field(T, 4, 2)),
    (ChunkedPattern(4), ref.chunked_field(T, 4)),
    (StridedPattern(4, 2), ref.strided_field(T, 4, 2)),
]


# The shapes of tests/layers/attention/test_local_patterns.py (4 heads of 4), to share compiled
# kernels in eager JAX.
def _qkv(rng, heads=4, kv_heads=2, length=T, dim=4):
    q = rng.normal(size=(2, length, heads, dim)).astype("float32")
    k = rng.normal(size=(2, length, kv_heads, dim)).astype("float32")
    v = rng.normal(size=(2, length, kv_heads, dim)).astype("float32")
    return q, k, v


def _run(pattern, q, k, v, **kwargs):
    block_size, offsets = pattern.block_layout(q.shape[1])
    out = block_sparse_attention(
        q, k, v, field=pattern.field, block_size=block_size, block_offsets=offsets, **kwargs
    )
    return keras.ops.convert_to_numpy(out)


@pytest.mark.parametrize("pattern, field", PATTERNS, ids=lambda p: getattr(p, "name", None))
def test_matches_dense_reference_with_gqa_padding_and_causal(rng, pattern, field):
    q, k, v = _qkv(rng)
    padding = np.arange(T)[None, :] < np.array([T, 6])[:, None]
    for causal in (False, True):
        for mask in (None, padding):
            out = _run(pattern, q, k, v, padding_mask=mask, causal=causal)
            expected = ref.sparse_attention(q, k, v, field, mask, causal)
            np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_multi_query_and_custom_scale(rng):
    q, k, v = _qkv(rng, heads=2, kv_heads=1)
    out = _run(LocalPattern(2, 2), q, k, v, scale=0.3)
    expected = ref.sparse_attention(q, k, v, ref.local_field(T, 2, 2), scale=0.3)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_sequence_shorter_than_a_block(rng):
    q, k, v = _qkv(rng, length=3)
    for pattern, field in ((LocalPattern(5, 5), ref.local_field(3, 5, 5)),
                           (StridedPattern(8, 2), ref.strided_field(3, 8, 2))):
        out = _run(pattern, q, k, v, causal=True)
        np.testing.assert_allclose(out, ref.sparse_attention(q, k, v, field, causal=True),
                                   atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_give_zeros(rng):
    q, k, v = _qkv(rng)
    padding = np.zeros((2, T), bool)
    padding[0, :2] = True  # row 0: queries from position 5 on see no key in their field
    out = _run(LocalPattern(2, 0), q, k, v, padding_mask=padding, causal=True)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, 5:], 0.0)
    assert np.any(out[0, :5] != 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_is_finite_and_close(rng, dtype):
    q, k, v = _qkv(rng)
    cast = [keras.ops.cast(a, dtype) for a in (q, k, v)]
    out = _run(LocalPattern(3, 0), *cast, causal=True).astype("float32")
    expected = ref.sparse_attention(q, k, v, ref.local_field(T, 3, 0), causal=True)
    np.testing.assert_allclose(out, expected, atol=5e-2, rtol=5e-2)


def test_dropout_in_training_only(rng):
    q, k, v = _qkv(rng)
    kwargs = dict(dropout_rate=0.5, seed_generator=keras.random.SeedGenerator(1))
    inference = _run(LocalPattern(3, 0), q, k, v, training=False, **kwargs)
    np.testing.assert_allclose(inference, _run(LocalPattern(3, 0), q, k, v), atol=1e-6)
    dropped = _run(LocalPattern(3, 0), q, k, v, training=True, **kwargs)
    assert np.all(np.isfinite(dropped)) and not np.allclose(dropped, inference)


def test_invalid_arguments(rng):
    q, k, v = _qkv(rng)
    band = LocalPattern(1).field
    with pytest.raises(ValueError, match="block_size must be a positive int. Received: block_size=0"):
        block_sparse_attention(q, k, v, field=band, block_size=0, block_offsets=(0,))
    with pytest.raises(ValueError, match="block_offsets"):
        block_sparse_attention(q, k, v, field=band, block_size=2, block_offsets=(1,), causal=True)
    with pytest.raises(ValueError, match="keys and values need the query length"):
        block_sparse_attention(q, k[:, :5], v[:, :5], field=band, block_size=2, block_offsets=(0,))
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        q3 = rng.normal(size=(2, T, 3, 4)).astype("float32")
        block_sparse_attention(q3, k, v, field=band, block_size=2, block_offsets=(0,))
