"""Xavier initialisation with a gain, `gain = a·L^b` and `gain = a/l^b` (survey §4.2.2)."""

import json

import keras
import numpy as np
import pytest

from keras_xf.initializers import ModelDepthXavier
from keras_xf.initializers import SubLayerDepthXavier
from keras_xf.initializers import Xavier
from tests.layer_checks import to_numpy
from tests.reference import deep_models as ref_deep

# Enough entries that the sample statistics pin the distribution down (not a layer test).
D_IN, D_OUT = 96, 160


def make(kind, distribution="uniform", seed=3):
    if kind == "xavier":
        return Xavier(gain=1.7, distribution=distribution, seed=seed), 1.7
    if kind == "model_depth":
        gain = ref_deep.model_depth_gain(0.5, 0.25, 24)
        return ModelDepthXavier(24, a=0.5, b=0.25, distribution=distribution, seed=seed), gain
    gain = ref_deep.sub_layer_depth_gain(2.0, 0.5, 9)
    return SubLayerDepthXavier(9, a=2.0, b=0.5, distribution=distribution, seed=seed), gain


@pytest.mark.parametrize("kind", ["xavier", "model_depth", "sub_layer_depth"])
def test_uniform_draws_in_the_survey_bound(kind):
    """`W ~ U(−η, η)`, `η = gain·√(6/(d_in + d_out))`: every entry within η, the extremes
    near ±η, the spread `η/√3`."""
    initializer, gain = make(kind)
    np.testing.assert_allclose(initializer.gain, gain, rtol=1e-12)
    w = to_numpy(initializer((D_IN, D_OUT)))
    bound = ref_deep.xavier_bound(gain, D_IN, D_OUT)
    assert np.abs(w).max() <= bound * (1 + 1e-6)
    assert np.abs(w).max() > 0.99 * bound
    np.testing.assert_allclose(w.std(), ref_deep.xavier_std(gain, D_IN, D_OUT), rtol=0.03)
    assert abs(w.mean()) < 0.02 * bound


@pytest.mark.parametrize("kind", ["xavier", "model_depth", "sub_layer_depth"])
def test_normal_has_the_uniform_variance(kind):
    """The normal form draws `N(0, η²/3)` (untruncated): the spread of the uniform form,
    with tails beyond `η`."""
    initializer, gain = make(kind, distribution="normal")
    w = to_numpy(initializer((D_IN, D_OUT)))
    std = ref_deep.xavier_std(gain, D_IN, D_OUT)
    np.testing.assert_allclose(w.std(), std, rtol=0.03)
    assert np.abs(w).max() > ref_deep.xavier_bound(gain, D_IN, D_OUT)


@pytest.mark.parametrize("distribution, keras_name",
                         [("uniform", "GlorotUniform"), ("normal", None)])
def test_gain_one_draws_as_keras_glorot(distribution, keras_name):
    """Gain 1 with the same seed gives Keras's Glorot draws, value for value."""
    ours = to_numpy(Xavier(distribution=distribution, seed=7)((12, 20)))
    if keras_name:
        theirs = getattr(keras.initializers, keras_name)(seed=7)((12, 20))
    else:
        theirs = keras.initializers.VarianceScaling(1.0, "fan_avg", "untruncated_normal",
                                                    seed=7)((12, 20))
    np.testing.assert_array_equal(ours, to_numpy(theirs))


def test_gains_follow_depth():
    """`a·L^b` grows with `L` for `b > 0`; `a/l^b` shrinks with `l`."""
    model = [ModelDepthXavier(n, a=1.0, b=0.5).gain for n in (1, 4, 16)]
    np.testing.assert_allclose(model, [1.0, 2.0, 4.0])
    sub = [SubLayerDepthXavier(l, a=1.0, b=1.0).gain for l in (1, 2, 4)]
    np.testing.assert_allclose(sub, [1.0, 0.5, 0.25])
    # DeepNet's β = (8N)^{-1/4} is a·L^b with a = 8^{-1/4}, b = −1/4.
    np.testing.assert_allclose(ModelDepthXavier(12, a=8**-0.25, b=-0.25).gain,
                               ref_deep.deep_norm_constants(12, 0)["encoder"][1])


def test_einsum_dense_gives_its_fan_axes():
    """An `EinsumDense` into heads (`W [d, H, Dh]`) passes its axes: `d_in = d`,
    `d_out = H·Dh` (not the convolution convention)."""
    dense = keras.layers.EinsumDense("btd,dhk->bthk", (None, 4, 40),
                                     kernel_initializer=Xavier(gain=2.0, seed=1))
    dense.build((2, 5, 96))
    w = to_numpy(dense.kernel)
    bound = ref_deep.xavier_bound(2.0, 96, 160)
    assert np.abs(w).max() <= bound * (1 + 1e-6) and np.abs(w).max() > 0.99 * bound


@pytest.mark.parametrize("kind", ["xavier", "model_depth", "sub_layer_depth"])
def test_config_round_trip_and_serialisation(kind):
    initializer, _ = make(kind, distribution="normal")
    config = initializer.get_config()
    clone = type(initializer).from_config(config)
    assert clone.get_config() == config
    serialized = json.loads(json.dumps(keras.initializers.serialize(initializer)))
    restored = keras.initializers.deserialize(serialized)
    assert type(restored) is type(initializer) and restored.get_config() == config
    np.testing.assert_array_equal(to_numpy(restored((4, 6))), to_numpy(initializer((4, 6))))


def test_dense_layer_config_keeps_the_initializer():
    dense = keras.layers.Dense(4, kernel_initializer=ModelDepthXavier(6, a=1.0, b=0.5))
    clone = keras.layers.Dense.from_config(dense.get_config())
    assert isinstance(clone.kernel_initializer, ModelDepthXavier)
    assert clone.kernel_initializer.get_config() == dense.kernel_initializer.get_config()


@pytest.mark.parametrize(
    "make_bad, pattern",
    [
        (lambda: Xavier(gain=0.0), r"gain must be a positive number. Received: gain=0.0"),
        (lambda: Xavier(distribution="truncated_normal"),
         r"distribution must be one of \('uniform', 'normal'\). Received: "
         r"distribution='truncated_normal'"),
        (lambda: ModelDepthXavier(0), r"num_layers must be a positive int. Received: num_layers=0"),
        (lambda: ModelDepthXavier(4, a=-1.0), r"a must be a positive number. Received: a=-1.0"),
        (lambda: ModelDepthXavier(4, b=float("inf")), r"b must be a finite number. Received: b=inf"),
        (lambda: SubLayerDepthXavier(2.5), r"depth must be a positive int. Received: depth=2.5"),
        (lambda: SubLayerDepthXavier(3, b="x"), r"b must be a finite number. Received: b='x'"),
    ],
)
def test_invalid_arguments_name_them(make_bad, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_bad()
