import keras
import numpy as np
import pytest

from keras_xf.layers import ClassToken
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming

DIM = 16


def tokens(rng, batch=2, length=5):
    return rng.normal(size=(batch, length, DIM)).astype("float32")


def test_prepends_one_learned_vector(rng):
    layer = ClassToken(initializer="random_normal", name="cls")
    x = tokens(rng)
    outputs = to_numpy(layer(x))
    assert outputs.shape == (2, 6, DIM) and count_params(layer) == DIM
    token = to_numpy(layer.token)[0, 0]
    np.testing.assert_array_equal(outputs[:, 0], np.broadcast_to(token, (2, DIM)))
    np.testing.assert_array_equal(outputs[:, 1:], x)
    assert layer.compute_output_shape((None, 5, DIM)) == (None, 6, DIM)
    clone = check_config_round_trip(layer)
    assert clone.name == "cls"


def test_a_position_of_its_own_is_added_to_the_token(rng):
    layer = ClassToken(initializer="random_normal", position=True)
    x = tokens(rng)
    outputs = to_numpy(layer(x))
    assert count_params(layer) == 2 * DIM
    expected = to_numpy(layer.token)[0, 0] + to_numpy(layer.position_embedding)[0, 0]
    np.testing.assert_allclose(outputs[:, 0], np.broadcast_to(expected, (2, DIM)), rtol=1e-6)
    assert not np.allclose(to_numpy(layer.token), to_numpy(layer.position_embedding))
    assert check_config_round_trip(layer).position
    model = wrap_in_model(layer, [x])
    check_fit_step(model, [x])
    raises_naming("position", lambda: ClassToken(position="yes"))


def test_extends_the_padding_mask(rng):
    layer = ClassToken()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    outputs, new_mask = layer(tokens(rng), padding_mask=mask)
    assert tuple(outputs.shape) == (2, 6, DIM)
    np.testing.assert_array_equal(to_numpy(new_mask), np.concatenate([[[True], [True]], mask], 1))


def test_fit_and_saving(rng, tmp_path):
    x = tokens(rng)
    layer = ClassToken()
    model = wrap_in_model(layer, [x])
    check_fit_step(model, [x])
    assert not np.allclose(to_numpy(layer.token), 0.0)
    check_saving(model, [x], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    outputs = check_mixed_precision(ClassToken, [tokens(rng)], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == policy.split("_")[1]


def test_rank_error():
    with pytest.raises(ValueError, match="rank 3"):
        ClassToken()(np.zeros((2, DIM), "float32"))


@pytest.mark.parametrize("mask", bad_padding_masks(2, 5))
def test_bad_padding_mask_raises(rng, mask):
    raises_naming("padding_mask", lambda: ClassToken()(tokens(rng), padding_mask=mask))


def test_bad_inputs_and_initializer_raise(rng):
    layer = ClassToken()
    layer(tokens(rng))
    raises_naming("inputs", lambda: layer(rng.normal(size=(2, 5, DIM + 1)).astype("float32")))
    raises_naming("initializer", lambda: ClassToken(initializer="not_an_initializer"))
