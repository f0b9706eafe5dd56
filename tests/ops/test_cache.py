"""`update_cache`: the functional write of DESIGN.md, and the in-place write that the traced
PyTorch decoding loop records."""

import keras
import numpy as np

from keras_xf.ops.backend_specific import cache_updates_in_place
from keras_xf.ops.cache import update_cache


def _cache_and_update(rng):
    cache = rng.normal(size=(2, 3, 6, 4)).astype("float32")  # [B, Hkv, L, Dh]
    update = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    expected = cache.copy()
    expected[:, :, 3:5] = update
    return cache, update, expected


def test_update_cache_writes_the_positions_and_leaves_its_input_alone(rng):
    cache, update, expected = _cache_and_update(rng)
    tensor = keras.ops.convert_to_tensor(cache)
    result = update_cache(tensor, keras.ops.convert_to_tensor(update), 3)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(result), expected)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tensor), cache)


def test_in_place_updates_give_the_same_values_with_a_tensor_index(rng):
    cache, update, expected = _cache_and_update(rng)
    tensor = keras.ops.convert_to_tensor(cache)
    index = keras.ops.convert_to_tensor(3, "int32")
    with cache_updates_in_place():
        result = update_cache(tensor, keras.ops.convert_to_tensor(update), index)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(result), expected)
    if keras.config.backend() == "torch":  # written into the given cache
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(tensor), expected)
    # Once the context ends, writes are functional again.
    fresh = keras.ops.convert_to_tensor(cache)
    update_cache(fresh, keras.ops.convert_to_tensor(update), 0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(fresh), cache)
