import keras
import numpy as np
import pytest

from keras_xf.layers import TokenPruning
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import check_bad_padding_mask
from tests.layers.bad_inputs import check_bad_sequence_inputs
from tests.layers.bad_inputs import raises_naming
from tests.reference import sequence_compression as ref

B, T, D = 3, 6, 4


def _scores(layer, x):
    return x.astype("float64") @ to_float64(layer.kernel) + float(to_float64(layer.bias))


@pytest.mark.parametrize("gate", ["multiply", "straight_through"])
@pytest.mark.parametrize("keep_ratio,lengths", [
    (0.5, None), (0.5, (6, 2, 0)), (0.3, (5, 4, 1)), (1.0, (6, 3, 0)), (0.1, (1, 6, 0)),
])
def test_matches_reference(gate, keep_ratio, lengths):
    rng = np.random.default_rng(0)
    x = random_normal(rng, (B, T, D))
    mask = None if lengths is None else padding_mask(lengths, T)
    layer = TokenPruning(keep_ratio, gate=gate)
    layer.build(x.shape)
    randomize_weights(layer, rng, scale=1.0)
    expected, expected_mask, expected_indices = ref.token_pruning(
        x.astype("float64"), _scores(layer, x), keep_ratio, mask, gate)
    outputs, kept_mask, indices = (checks.to_numpy(t) for t in layer(x, padding_mask=mask))
    assert outputs.shape == expected.shape and indices.dtype == np.int32
    np.testing.assert_array_equal(kept_mask, expected_mask)
    # Which padded tokens fill a short row is the backend's choice; real ones are not.
    np.testing.assert_array_equal(np.where(kept_mask, indices, -1),
                                  np.where(expected_mask, expected_indices, -1))
    assert np.all(np.diff(indices, axis=1) > 0)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    assert np.all(np.isfinite(outputs))


def test_padded_tokens_never_kept_ahead_of_real_ones():
    rng = np.random.default_rng(1)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((2, 4, 0), T)
    layer = TokenPruning(0.5)
    layer.build(x.shape)
    layer.bias.assign(5.0)
    # Padded tokens get far higher scores than real ones; they still rank last.
    noisy = np.where(mask[:, :, None], x, 100.0).astype("float32")
    layer.kernel.assign(np.ones((D,), "float32"))
    _, kept_mask, indices = (checks.to_numpy(t) for t in layer(noisy, padding_mask=mask))
    np.testing.assert_array_equal(kept_mask, [[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert set(indices[0][:2]) == {0, 1}
    assert np.all(indices[1] < 4)


@pytest.mark.parametrize("gate", ["multiply", "straight_through"])
def test_fit_trains_the_scores(gate):
    """The selection has no gradient; the gate on the kept tokens trains `w` and `b`."""
    rng = np.random.default_rng(2)
    layer = TokenPruning(0.5, gate=gate)
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    pruned, _, _ = layer(x, padding_mask=mask)
    model = keras.Model([x, mask], keras.ops.sum(pruned, axis=1))
    before = [checks.to_numpy(w).copy() for w in layer.weights]
    checks.check_fit_step(model, [random_normal(rng, (B, T, D)), padding_mask((6, 3, 0), T)])
    for old, new in zip(before, layer.weights):
        assert not np.allclose(old, checks.to_numpy(new)), "fit did not train the scores"


def _model(layer):
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    return keras.Model([x, mask], list(layer(x, padding_mask=mask)))


def test_config_and_saving(tmp_path):
    rng = np.random.default_rng(3)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3, 0), T)]
    layer = TokenPruning(0.5, gate="straight_through")
    clone = checks.check_config_round_trip(layer)
    assert clone.gate == "straight_through"
    model = _model(layer)
    assert checks.count_params(layer) == D + 1
    checks.check_saving(model, inputs, tmp_path)


@checks.xla_only
def test_jit_compile():
    rng = np.random.default_rng(4)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3, 1), T)]
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    pruned, _, _ = TokenPruning(0.5)(x, padding_mask=mask)
    checks.check_jit_compile(keras.Model([x, mask], pruned), inputs)


def test_mixed_precision():
    rng = np.random.default_rng(5)
    checks.check_mixed_precision(lambda **kw: TokenPruning(0.5, **kw),
                                 [random_normal(rng, (B, T, D))])


@pytest.mark.parametrize("kwargs,name", [
    (dict(keep_ratio=0), "keep_ratio"),
    (dict(keep_ratio=1.5), "keep_ratio"),
    (dict(keep_ratio=True), "keep_ratio"),
    (dict(keep_ratio="half"), "keep_ratio"),
    (dict(gate="hard"), "gate"),
    (dict(kernel_initializer="nope"), "kernel_initializer"),
])
def test_bad_arguments(kwargs, name):
    raises_naming(name, lambda: TokenPruning(**kwargs))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    check_bad_padding_mask(TokenPruning(0.5), mask, (B, T, D))


def test_bad_inputs():
    check_bad_sequence_inputs(lambda: TokenPruning(0.5), (B, T, D), static_length=True)
