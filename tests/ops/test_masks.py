import numpy as np
import pytest

from keras_xf import ops as xops
from keras_xf.ops.masks import zero_padded
from tests.layer_checks import to_numpy
from tests.reference import attention as ref
from tests.reference import sequence_compression as compression_ref


@pytest.mark.parametrize("query_length,key_length,offset", [(4, None, 0), (3, 6, 2), (1, 5, 4)])
def test_causal_mask_matches_reference(query_length, key_length, offset):
    mask = to_numpy(xops.causal_mask(query_length, key_length, offset))
    np.testing.assert_array_equal(mask, ref.causal_mask(query_length, key_length, offset))


def test_causal_mask_of_survey_example_is_lower_triangular():
    mask = to_numpy(xops.causal_mask(4))
    np.testing.assert_array_equal(mask, np.tril(np.ones((4, 4), bool)))


def test_padding_mask_marks_real_tokens():
    ids = np.array([[5, 3, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(
        to_numpy(xops.padding_mask(ids)), [[True, True, False, False], [False] * 4]
    )
    np.testing.assert_array_equal(to_numpy(xops.padding_mask(ids, pad_token_id=3))[0], [1, 0, 1, 1])


def test_merge_masks_broadcasts_every_rank_and_skips_none():
    causal = np.tril(np.ones((3, 3), bool))  # [T, S]
    batch = np.ones((2, 3, 3), bool)
    batch[1, :, 0] = False  # [B, T, S]
    heads = np.ones((1, 2, 3, 3), bool)
    heads[0, 1, 2, :] = False  # [B, H, T, S]
    merged = to_numpy(xops.merge_masks(None, causal, batch, heads))
    expected = causal[None, None] & batch[:, None] & heads
    assert merged.shape == (2, 2, 3, 3)
    np.testing.assert_array_equal(merged, expected)
    assert xops.merge_masks(None, None) is None


def test_merge_masks_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        xops.merge_masks(np.ones((3,), bool))


def test_downsample_padding_mask_matches_reference():
    mask = np.arange(7)[None, :] < np.array([7, 4, 1, 0])[:, None]
    for kernel_size, stride in [(2, 2), (3, 2), (4, 3), (1, 1)]:
        kernel = np.ones((kernel_size, 1, 1))
        _, expected = compression_ref.downsample(np.ones((4, 7, 1)), kernel, None, stride, mask)
        actual = xops.masks.downsample_padding_mask(mask, kernel_size, stride)
        np.testing.assert_array_equal(to_numpy(actual), expected)


def test_masked_mean_averages_the_real_tokens():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5, 4)).astype("float32")
    mask = np.arange(5)[None, :] < np.array([[5], [2], [0]])
    pooled = to_numpy(xops.masked_mean(values, mask))
    assert pooled.dtype == np.float32
    np.testing.assert_allclose(pooled[0], values[0].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled[1], values[1, :2].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pooled[2], np.zeros(4))  # a fully padded row
    np.testing.assert_allclose(to_numpy(xops.masked_mean(values)), values.mean(1), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 2, 4)])
def test_zero_padded_zeroes_the_padded_positions(shape):
    values = np.arange(1, np.prod(shape) + 1, dtype="float32").reshape(shape)
    mask = np.array([[True, False, True], [False, False, False]])
    got = to_numpy(zero_padded(values, mask))
    expected = values * mask.reshape(mask.shape + (1,) * (len(shape) - 2))
    np.testing.assert_array_equal(got, expected)
