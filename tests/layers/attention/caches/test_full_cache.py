"""FullCache: the head-major pair of keys and values, written at a position and read back in
the layout of the attention ops; its structure check names what it received."""

import keras
import numpy as np
import pytest

from keras_xf.layers.attention.caches import FullCache
from tests.layer_checks import to_numpy

B, HKV, L, DK, DV = 2, 3, 6, 4, 5


def test_write_puts_the_new_positions_in_place_and_masks_the_later_ones(rng):
    kind = FullCache()
    cache = kind.allocate(B, L, HKV, DK, DV, "float32")
    assert [tuple(part.shape) for part in cache] == [(B, HKV, L, DK), (B, HKV, L, DV)]
    key = rng.normal(size=(B, 2, HKV, DK)).astype("float32")  # [B, t, Hkv, d′]
    value = rng.normal(size=(B, 2, HKV, DV)).astype("float32")
    new_cache, attended, positions, valid = kind.write(cache, key, value, 3, 2)
    keys, values = (to_numpy(part) for part in kind.read(attended))  # [B, L, Hkv, ·]
    np.testing.assert_array_equal(keys[:, 3:5], key)
    np.testing.assert_array_equal(values[:, 3:5], value)
    np.testing.assert_array_equal(keys[:, :3], 0.0)
    np.testing.assert_array_equal(to_numpy(positions), np.arange(L))
    np.testing.assert_array_equal(to_numpy(valid), [[True] * 5 + [False]])
    assert kind.key_length(new_cache, 2) == L and int(to_numpy(kind.length(new_cache))) == L


def test_fill_keeps_the_cache_dtype(rng):
    kind = FullCache()
    cache = kind.allocate(B, L, HKV, DK, DV, "float16")
    key = rng.normal(size=(B, L, HKV, DK)).astype("float32")
    value = rng.normal(size=(B, L, HKV, DV)).astype("float32")
    filled = kind.fill(cache, key, value)
    assert all(keras.backend.standardize_dtype(part.dtype) == "float16" for part in filled)
    np.testing.assert_allclose(to_numpy(kind.read(filled)[0]).astype("float32"), key,
                               atol=1e-2)


@pytest.mark.parametrize("cache,received", [
    (np.zeros((B, HKV, L, DK), "float32"), "a tensor of shape"),
    ((np.zeros((B, HKV, L, DK), "float32"),), "tuple of 1 entries"),
    ((np.zeros((B, L, DK), "float32"), np.zeros((B, L, DK), "float32")), "tuple of 2 entries"),
])
def test_check_names_what_it_received(cache, received):
    with pytest.raises(ValueError, match=f"cache must be the pair.*Received: {received}"):
        FullCache.check(cache)
