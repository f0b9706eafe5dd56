"""EarlyExitHeads: an output layer per exit, or one shared (survey §5.6)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import EarlyExitHeads
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import to_numpy


@pytest.mark.parametrize("shared", [False, True])
def test_each_exit_uses_its_head(rng, shared):
    heads = EarlyExitHeads(num_exits=3, num_classes=4, shared=shared)
    x = rng.normal(size=(2, 8)).astype("float32")
    outputs = [to_numpy(heads(x, exit_index=e)) for e in range(3)]
    assert heads.count_params() == (1 if shared else 3) * (8 * 4 + 4)
    for e, out in enumerate(outputs):
        kernel, bias = heads.heads[0 if shared else e].output_dense.get_weights()
        np.testing.assert_allclose(out, x @ kernel + bias, rtol=1e-5, atol=1e-6)
    assert np.allclose(outputs[0], outputs[2]) == shared
    check_config_round_trip(heads)


def test_float32_logits_under_mixed_precision(rng):
    heads = EarlyExitHeads(2, 3, dtype="mixed_bfloat16")
    out = heads(rng.normal(size=(2, 8)).astype("float32"), exit_index=1)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


@pytest.mark.parametrize("kwargs, call, match", [
    ({"num_exits": 0, "num_classes": 2}, None, "num_exits"),
    ({"num_exits": 2, "num_classes": 2, "shared": "yes"}, None, "shared"),
    ({"num_exits": 2, "num_classes": 2}, 2, "exit_index"),
])
def test_bad_arguments(rng, kwargs, call, match):
    with pytest.raises(ValueError, match=match):
        heads = EarlyExitHeads(**kwargs)
        heads(rng.normal(size=(2, 8)).astype("float32"), exit_index=call)
