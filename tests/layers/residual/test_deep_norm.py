"""DeepNorm's depth-derived constants (survey §4.2.1; DeepNet's table) and their settings."""

import numpy as np
import pytest

from keras_xf.layers import DeepNorm
from keras_xf.layers import deep_norm
from tests.reference import deep_models as ref_deep


@pytest.mark.parametrize("encoder_layers, decoder_layers",
                         [(6, 0), (100, 0), (0, 1), (0, 48), (6, 6), (12, 200)])
def test_constants_match_the_table(encoder_layers, decoder_layers):
    constants = deep_norm(encoder_layers=encoder_layers, decoder_layers=decoder_layers)
    expected = ref_deep.deep_norm_constants(encoder_layers, decoder_layers)
    assert set(constants) == set(expected)
    for side, (alpha, beta) in expected.items():
        assert isinstance(constants[side], DeepNorm)
        np.testing.assert_allclose([constants[side].alpha, constants[side].beta], [alpha, beta],
                                   rtol=1e-12)


def test_constants_move_with_depth():
    """Deeper models: a larger identity weight α and a smaller initial gain β; for an
    `N`-layer encoder-only model α⁴ = 2N and β⁴ = 1/(8N) (so α·β = 1/√2 at every depth)."""
    shallow, deep = deep_norm(encoder_layers=6)["encoder"], deep_norm(encoder_layers=96)["encoder"]
    assert deep.alpha > shallow.alpha > 1 and deep.beta < shallow.beta < 1
    np.testing.assert_allclose(deep.alpha**4, 2 * 96)
    np.testing.assert_allclose(deep.alpha * deep.beta, 2**-0.5)


def test_settings():
    constants = deep_norm(decoder_layers=24)["decoder"]
    assert constants.residual_arguments() == {
        "norm_placement": "weighted", "inner_weight": constants.alpha, "outer_weight": 0.0}
    assert constants.depth_initialization() == {
        "method": "deep_norm", "beta": constants.beta, "distribution": "normal"}
    assert constants.depth_initialization("uniform")["distribution"] == "uniform"


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({}, r"encoder_layers > 0 or decoder_layers > 0. Received: encoder_layers=0"),
        ({"encoder_layers": -1}, r"encoder_layers must be an int >= 0. Received: encoder_layers=-1"),
        ({"decoder_layers": 2.5}, r"decoder_layers=2.5"),
        ({"decoder_layers": True}, r"decoder_layers=True"),
    ],
)
def test_invalid_depths_name_the_argument(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        deep_norm(**kwargs)
