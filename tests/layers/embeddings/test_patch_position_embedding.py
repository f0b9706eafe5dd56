"""PatchPositionEmbedding (learned and 2-D sinusoidal) and the pure 2-D table."""

import keras
import numpy as np
import pytest

from keras_xf.layers import PatchEmbedding
from keras_xf.layers import PatchPositionEmbedding
from keras_xf.ops import sinusoid_table_2d
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.reference import vision as reference
from tests.layers.bad_inputs import raises_naming

ROWS, COLS, DIM = 2, 3, 16


def make_layer(**kwargs):
    kwargs.setdefault("grid_size", (ROWS, COLS))
    return PatchPositionEmbedding(**kwargs)


def patches(rng, batch=2, length=ROWS * COLS, dim=DIM):
    return rng.normal(size=(batch, length, dim)).astype("float32")


@pytest.mark.parametrize("rows, cols, dim, base", [(2, 3, 16, 10000.0), (4, 4, 12, 100.0)])
def test_table_matches_reference(rows, cols, dim, base):
    table = to_numpy(sinusoid_table_2d(rows, cols, dim, base))
    np.testing.assert_allclose(table, reference.sinusoidal_2d(rows, cols, dim, base), atol=1e-5)
    # Same row -> same first half; same column -> same second half.
    np.testing.assert_allclose(table[1, : dim // 2], table[0, : dim // 2], atol=1e-6)
    np.testing.assert_allclose(table[cols, dim // 2 :], table[0, dim // 2 :], atol=1e-6)


def test_sinusoidal_layer_and_config(rng):
    layer = make_layer(kind="sinusoidal_2d", base=100.0, name="pos")
    x = patches(rng)
    outputs = to_numpy(layer(x))
    assert not layer.weights
    np.testing.assert_allclose(
        outputs, np.broadcast_to(reference.sinusoidal_2d(ROWS, COLS, DIM, 100.0), x.shape),
        atol=1e-5)
    clone = check_config_round_trip(layer)
    assert clone.grid_size == (ROWS, COLS) and clone.kind == "sinusoidal_2d"
    np.testing.assert_allclose(to_numpy(clone(x)), outputs)
    square = make_layer(grid_size=3, kind="sinusoidal_2d")
    assert square.grid_size == (3, 3) and square.num_patches == 9


def test_learned_table_fit_and_saving(rng, tmp_path):
    layer = make_layer()
    x = patches(rng)
    outputs = to_numpy(layer(x))
    assert count_params(layer) == ROWS * COLS * DIM
    np.testing.assert_array_equal(outputs, np.broadcast_to(to_numpy(layer.position_embeddings), x.shape))
    model = wrap_in_model(make_layer(), [x])
    check_fit_step(model, [x])
    check_saving(model, [x], tmp_path)


def test_adds_to_patch_embeddings(rng):
    # The usual wiring: `e_n + p_n` over a PatchEmbedding's row-major patches.
    images = rng.normal(size=(2, 4, 6, 1)).astype("float32")
    embed = PatchEmbedding(patch_size=2, hidden_dim=DIM)
    tokens = embed(images)
    summed = to_numpy(tokens + make_layer(kind="sinusoidal_2d")(tokens))
    expected = reference.patch_embedding(images, 2, to_numpy(embed.projection.kernel),
                                         to_numpy(embed.projection.bias))
    np.testing.assert_allclose(summed, expected + reference.sinusoidal_2d(ROWS, COLS, DIM),
                               atol=1e-5)


@pytest.mark.parametrize("kind, policy", [("learned", "mixed_float16"),
                                          ("sinusoidal_2d", "mixed_bfloat16")])
def test_mixed_precision(rng, kind, policy):
    outputs = check_mixed_precision(lambda **kw: make_layer(kind=kind, **kw), [patches(rng)],
                                    policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == policy.split("_")[1]


def test_errors(rng):
    for kwargs, match in [
        ({"grid_size": 0}, "grid_size=0"),
        ({"grid_size": (2, 3, 4)}, r"grid_size=\(2, 3, 4\)"),
        ({"kind": "rotary"}, "kind='rotary'"),
        ({"base": 1.0}, "base=1.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_layer(**kwargs)
    with pytest.raises(ValueError, match="7 patches with grid_size=\\(2, 3\\)"):
        make_layer()(patches(rng, length=7))
    with pytest.raises(ValueError, match="dim=15"):
        make_layer(kind="sinusoidal_2d")(patches(rng, dim=15))
    with pytest.raises(ValueError, match="dim=7"):
        sinusoid_table_2d(2, 2, 7)
    with pytest.raises(ValueError, match="rows=0"):
        sinusoid_table_2d(0, 2, 8)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"base": "x"}, "base"),
        ({"base": -2.0}, "base"),
        ({"initializer": "not_an_initializer"}, "initializer"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: make_layer(**kwargs))


@pytest.mark.parametrize("kind", ["learned", "sinusoidal_2d"])
def test_bad_inputs_raise(rng, kind):
    layer = make_layer(kind=kind)
    layer(patches(rng))
    raises_naming("inputs", lambda: layer(patches(rng, dim=DIM + 2)))
    raises_naming("inputs", lambda: layer(rng.normal(size=(2, DIM)).astype("float32")))
