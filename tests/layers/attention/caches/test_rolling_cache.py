"""RollingCache: slot `p mod slots` holds position `p`; a single token attends to the slots by
their absolute positions, a prompt to the old slots and its own keys; masks are refused."""

import numpy as np
import pytest

from keras_xf.layers.attention.caches import FullCache
from keras_xf.layers.attention.caches import RollingCache
from keras_xf.layers.attention.caches import cache_kind
from keras_xf.layers.attention.patterns.local_pattern import LocalPattern
from tests.layer_checks import to_numpy

B, HKV, D, SLOTS = 1, 1, 2, 3


def _token(position):
    """Keys and values of one position, `[B, 1, Hkv, D]`, holding the position's number."""
    return np.full((B, 1, HKV, D), float(position), "float32")


def test_tokens_written_in_order_fill_the_slots_modulo_their_number():
    kind = RollingCache(SLOTS)
    cache = kind.allocate(B, 10, HKV, D, D, "float32")
    assert kind.holds(cache) and tuple(cache[0].shape) == (B, HKV, SLOTS, D)
    for position in range(5):
        cache, attended, positions, valid = kind.write(cache, _token(position),
                                                       _token(position), position, 1)
    keys = to_numpy(kind.read(cache)[0])[0, :, 0, 0]
    np.testing.assert_array_equal(keys, [3.0, 4.0, 2.0])  # slot p mod 3 holds position p
    np.testing.assert_array_equal(to_numpy(positions), [3, 4, 2])
    np.testing.assert_array_equal(to_numpy(valid), [[True, True, True]])


def test_a_prompt_attends_to_the_old_slots_and_its_own_keys():
    kind = RollingCache(SLOTS)
    cache = kind.allocate(B, 10, HKV, D, D, "float32")
    prompt = np.arange(4, dtype="float32").reshape(1, 4, 1, 1) * np.ones((B, 4, HKV, D), "float32")
    new_cache, attended, positions, valid = kind.write(cache, prompt, prompt, 0, 4)
    assert kind.key_length(cache, 4) == SLOTS + 4
    np.testing.assert_array_equal(to_numpy(positions), [-3, -2, -1, 0, 1, 2, 3])
    np.testing.assert_array_equal(to_numpy(valid), [[False] * 3 + [True] * 4])
    np.testing.assert_array_equal(to_numpy(kind.read(new_cache)[0])[0, :, 0, 0], [3.0, 1.0, 2.0])


def test_masks_are_refused_and_the_kind_follows_the_pattern():
    with pytest.raises(ValueError, match="rolling cache.*padding_mask=True"):
        RollingCache(SLOTS).check_masks(np.ones((B, 1), bool), None)
    pattern = LocalPattern(2)
    rolling = cache_kind(pattern)
    assert isinstance(rolling, RollingCache) and rolling.slots == pattern.cache_slots
    cache = rolling.allocate(B, 10, HKV, D, D, "float32")
    assert isinstance(cache_kind(pattern, cache, 0, None), RollingCache)
    assert isinstance(cache_kind(pattern, cache, None, None), FullCache)  # read as it is
    assert type(cache_kind(None)) is FullCache
