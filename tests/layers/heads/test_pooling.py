"""Pooling: first token, masked mean and masked max over the real tokens."""

import keras
import numpy as np
import pytest

from keras_xf.layers import Pooling
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import xla_only
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming

MODES = ("cls", "mean", "max")
BATCH, LENGTH, WIDTH = 3, 6, 4
REAL_LENGTHS = [LENGTH, 2, 0]  # full, partly padded, fully padded


def make_inputs(rng):
    x = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    padding = np.arange(LENGTH)[None, :] < np.array(REAL_LENGTHS)[:, None]
    return x, padding


def numpy_pool(mode, x, padding):
    out = np.zeros((x.shape[0], x.shape[-1]))
    for b in range(x.shape[0]):
        real = x[b][padding[b]].astype("float64")
        if mode == "cls":
            out[b] = x[b, 0]
        elif len(real):
            out[b] = real.mean(axis=0) if mode == "mean" else real.max(axis=0)
    return out


def pooled_model(mode, x, padding, dtype=None):
    """`Dense -> Pooling(padding_mask)`: gives the pooling a trainable neighbour for `fit`."""
    inputs = keras.Input(shape=x.shape[1:], name="x")
    mask = keras.Input(shape=padding.shape[1:], dtype="bool", name="padding_mask")
    hidden = keras.layers.Dense(WIDTH, dtype=dtype)(inputs)
    outputs = Pooling(mode, dtype=dtype)(hidden, padding_mask=mask)
    return keras.Model([inputs, mask], outputs)


def test_build_and_output_shape():
    layer = Pooling("max")
    layer.build((BATCH, LENGTH, WIDTH))
    assert layer.built and count_params(layer) == 0
    assert tuple(layer.compute_output_shape((BATCH, LENGTH, WIDTH))) == (BATCH, WIDTH)
    assert Pooling().mode == "mean"


@pytest.mark.parametrize("mode", MODES)
def test_config_round_trip(mode):
    assert check_config_round_trip(Pooling(mode)).mode == mode


@pytest.mark.parametrize("mode", MODES)
def test_matches_numpy(rng, mode):
    x, padding = make_inputs(rng)
    actual = to_numpy(Pooling(mode)(x, padding_mask=padding))
    assert actual.shape == (BATCH, WIDTH)
    np.testing.assert_allclose(actual, numpy_pool(mode, x, padding), atol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_without_mask_pools_every_token(rng, mode):
    x, _ = make_inputs(rng)
    expected = x.mean(axis=1) if mode == "mean" else x.max(axis=1)
    np.testing.assert_allclose(to_numpy(Pooling(mode)(x)), expected, atol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_fully_padded_rows_give_zeros(rng, mode):
    x, padding = make_inputs(rng)
    x[2] = 1e4  # large padded values must not leak into the result
    actual = to_numpy(Pooling(mode)(x, padding_mask=padding))
    np.testing.assert_array_equal(actual[2], 0.0)
    all_padded = to_numpy(Pooling(mode)(x, padding_mask=np.zeros_like(padding)))
    np.testing.assert_array_equal(all_padded, 0.0)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_padding_is_ignored(rng, mode):
    x, padding = make_inputs(rng)
    y = to_numpy(Pooling(mode)(x, padding_mask=padding))
    changed = x.copy()
    changed[~padding] = 1e4  # huge values where padded: would dominate a max or a mean
    np.testing.assert_allclose(to_numpy(Pooling(mode)(changed, padding_mask=padding)), y, atol=1e-6)
    changed[1, 0] += 1e3  # a real token does count
    assert not np.allclose(to_numpy(Pooling(mode)(changed, padding_mask=padding))[1], y[1])


def test_max_of_negative_values(rng):
    """Masked positions must not act as zeros: the max of all-negative tokens stays negative."""
    x, padding = make_inputs(rng)
    x = -np.abs(x) - 1.0
    actual = to_numpy(Pooling("max")(x, padding_mask=padding))
    assert np.all(actual[:2] < -1.0)
    np.testing.assert_allclose(actual, numpy_pool("max", x, padding), atol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_fit_step(rng, mode):
    x, padding = make_inputs(rng)
    check_fit_step(pooled_model(mode, x, padding), [x, padding])


def test_saving(rng, tmp_path):
    x, padding = make_inputs(rng)
    loaded = check_saving(pooled_model("max", x, padding), [x, padding], tmp_path)
    assert [layer.mode for layer in loaded.layers if isinstance(layer, Pooling)] == ["max"]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("mode", MODES)
def test_mixed_precision(rng, policy, mode):
    x, padding = make_inputs(rng)
    outputs = check_mixed_precision(
        lambda dtype: Pooling(mode, dtype=dtype), [x], {"padding_mask": padding}, policy=policy
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    np.testing.assert_allclose(
        to_numpy(outputs).astype("float32"), numpy_pool(mode, x, padding), atol=2e-2
    )


@xla_only
def test_jit_compile(rng):
    x, padding = make_inputs(rng)
    check_jit_compile(pooled_model("mean", x, padding), [x, padding])


def test_invalid_mode():
    with pytest.raises(ValueError, match=r"mode='sum'"):
        Pooling("sum")


def test_wrong_input_rank():
    with pytest.raises(ValueError, match=r"rank 3.*inputs_shape=\(2, 4\)"):
        Pooling("mean")(np.zeros((2, WIDTH), "float32"))


@pytest.mark.parametrize("mask", bad_padding_masks(BATCH, LENGTH))
@pytest.mark.parametrize("mode", MODES)
def test_bad_padding_mask_raises(rng, mode, mask):
    x, _ = make_inputs(rng)
    raises_naming("padding_mask", lambda: Pooling(mode)(x, padding_mask=mask))
