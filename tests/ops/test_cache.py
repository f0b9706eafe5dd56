"""`update_cache`: the functional write of DESIGN.md, and the in-place write that a TorchScript
trace of the decoding loop records on PyTorch."""

import warnings

import keras
import numpy as np
import pytest

from keras_xf.ops.cache import records_in_place_writes
from keras_xf.ops.cache import update_cache
from keras_xf.ops.cache import write_cache_in_place

torch_only = pytest.mark.skipif(
    keras.config.backend() != "torch",
    reason="in-place writes are PyTorch's (torch.jit.trace); XLA updates loop buffers itself",
)


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


def test_eager_writes_are_functional():
    assert records_in_place_writes() is False


@torch_only
def test_a_traced_write_is_in_place_and_gives_the_same_values(rng):
    import torch

    cache, update, expected = _cache_and_update(rng)
    recorded = []

    def write(cache, update, index):
        recorded.append(records_in_place_writes())
        return update_cache(cache, update, index)

    example = (torch.zeros(cache.shape), torch.zeros(update.shape), torch.tensor(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarning: shapes are fixed per trace
        traced = torch.jit.trace(write, example, check_trace=False)
    assert recorded == [True]
    tensor = torch.tensor(cache)
    result = traced(tensor, torch.tensor(update), torch.tensor(3))
    np.testing.assert_array_equal(result.numpy(), expected)
    np.testing.assert_array_equal(tensor.numpy(), expected)  # written into the given cache
    # Outside the trace, writes are functional again.
    fresh = torch.tensor(cache)
    update_cache(fresh, torch.tensor(update), 0)
    np.testing.assert_array_equal(fresh.numpy(), cache)


@torch_only
def test_an_in_place_write_into_a_broadcast_view_copies_it_once(rng):
    import torch

    row = torch.tensor(rng.normal(size=(1, 3, 6, 4)).astype("float32"))
    original = row.clone()
    beams = row.expand(2, 3, 6, 4)  # stride 0 over the beams
    update = torch.tensor(rng.normal(size=(2, 3, 1, 4)).astype("float32"))
    result = write_cache_in_place(beams, update, 2)
    expected = np.repeat(row.numpy(), 2, axis=0)
    expected[:, :, 2:3] = update.numpy()
    np.testing.assert_array_equal(result.numpy(), expected)
    assert result.stride()[0] != 0
    np.testing.assert_array_equal(row.numpy(), original.numpy())  # the shared row is kept
