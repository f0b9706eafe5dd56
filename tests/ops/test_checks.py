"""The argument checks shared by every layer (`keras_xf/ops/checks.py`)."""

import keras
import numpy as np
import pytest

from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_seed
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.checks import known_width


@pytest.mark.parametrize("value", [None, "no_such_initializer", 3, [1]])
def test_get_initializer_refuses_what_is_not_an_initializer(value):
    with pytest.raises(ValueError, match="kernel_initializer must be a Keras initializer"):
        get_initializer("kernel_initializer", value)


def test_get_initializer_takes_names_configs_and_instances():
    assert isinstance(get_initializer("k", "zeros"), keras.initializers.Zeros)
    config = {"class_name": "Constant", "config": {"value": 2.0}}
    assert get_initializer("k", config).value == 2.0
    ones = keras.initializers.Ones()
    assert get_initializer("k", ones) is ones


@pytest.mark.parametrize("seed", [None, 0, 7, np.int64(3)])
def test_check_seed_takes_none_and_non_negative_ints(seed):
    checked = check_seed(seed)
    assert checked == seed and (checked is None or type(checked) is int)


@pytest.mark.parametrize("seed", [-1, True, "x", [], 1.5])
def test_check_seed_names_the_argument(seed):
    with pytest.raises(ValueError, match=r"seed must be an int >= 0\. Received: seed="):
        check_seed(seed)


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "1"])
def test_check_positive_number_refuses(value):
    with pytest.raises(ValueError, match="scale must be a positive number"):
        check_positive_number("scale", value)


@pytest.mark.parametrize("value", [True, False])
def test_check_bool_takes_bools(value):
    assert check_bool("use_bias", value) is value


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.bool_(True)])
def test_check_bool_names_the_argument(value):
    with pytest.raises(ValueError, match=r"use_bias must be a bool\. Received: use_bias="):
        check_bool("use_bias", value)


def test_known_width_is_the_last_dimension():
    assert known_width((2, None, 8)) == 8
    with pytest.raises(ValueError, match=r"inputs must have a known last dimension\. "
                                         r"Received: inputs\.shape=\(2, 5, None\)"):
        known_width((2, 5, None))
