"""ops.convolution: causal and centred padding, shifted windows and the rolling cache."""

import keras
import numpy as np
import pytest

from keras_xf.ops import causal_fft_convolution
from keras_xf.ops import convolution_padding
from keras_xf.ops import pad_sequence
from keras_xf.ops import rolling_cache
from keras_xf.ops import shifted_windows
from tests.reference import convolutions as ref


@pytest.mark.parametrize("causal", [False, True])
def test_windows_read_the_positions_of_the_equations(causal):
    """Window `[t, j]` holds `x_{t−l+j}` (zero outside), for odd and even sizes."""
    length = 6
    x = np.arange(1, length + 1, dtype="float32")[None, :, None]  # positions 0…5 hold 1…6
    for kernel_size in (1, 2, 3, 4):
        left, right = convolution_padding(kernel_size, causal)
        assert left + right == kernel_size - 1 and left == ref.window_start(kernel_size, causal)
        padded = pad_sequence(x, kernel_size, causal)
        windows = keras.ops.convert_to_numpy(shifted_windows(padded, kernel_size))[0, :, :, 0]
        assert windows.shape == (length, kernel_size)
        for t in range(length):
            for j in range(kernel_size):
                s = t - left + j
                assert windows[t, j] == (s + 1 if 0 <= s < length else 0)


def test_history_and_rolling_cache():
    x = np.arange(1, 4, dtype="float32")[None, :, None]
    history = np.array([[[-2.0], [-1.0]]], "float32")
    padded = pad_sequence(x, 3, True, history=history)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(padded)[0, :, 0], [-2, -1, 1, 2, 3])
    cache = rolling_cache(padded, 3)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(cache)[0, :, 0], [2, 3])
    assert keras.backend.standardize_dtype(cache.dtype) == "float32"
    with pytest.raises(ValueError, match="causal=False"):
        pad_sequence(x, 3, False, history=history)


def test_rolling_cache_ends_at_the_last_valid_token():
    # Rows: all valid, right-padded after one token, fully padded; history -2, -1.
    x = np.tile(np.arange(1, 4, dtype="float32")[None, :, None], (3, 1, 2))
    history = np.tile(np.array([[[-2.0], [-1.0]]], "float32"), (3, 1, 2))
    mask = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
    padded = pad_sequence(x * mask[..., None], 3, True, history=history)
    cache = keras.ops.convert_to_numpy(rolling_cache(padded, 3, mask))
    np.testing.assert_array_equal(cache[..., 0], [[2, 3], [-1, 1], [-2, -1]])
    np.testing.assert_array_equal(cache[..., 0], cache[..., 1])
    assert tuple(rolling_cache(padded[:, :4], 1, mask).shape) == (3, 0, 2)
    with pytest.raises(ValueError, match="kernel_size=0"):
        convolution_padding(0, True)


@pytest.mark.parametrize("length", [1, 5, 8])
def test_causal_fft_convolution_equals_the_sum(rng, length):
    """`y_t = Σ_{i≤t} K_{t−i} s_i` per channel, by FFT."""
    x = rng.normal(size=(2, length, 3)).astype("float32")
    kernel = rng.normal(size=(length, 3)).astype("float32")
    expected = np.zeros(x.shape)
    for t in range(length):
        for i in range(t + 1):
            expected[:, t] += kernel[t - i] * x[:, i]
    y = causal_fft_convolution(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(kernel))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), expected, rtol=1e-4, atol=1e-4)
