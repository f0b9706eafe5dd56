import keras
import numpy as np
import pytest

from keras_xf.layers import SinusoidalPositionEncoding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import positions as ref
from tests.layers.bad_inputs import raises_naming


def embeddings(rng, batch=2, length=6, dim=8):
    return rng.normal(size=(batch, length, dim)).astype("float32")


def encoder_model(layer, length=6, dim=8, with_positions=False):
    """x -> Dense -> (+ PE) -> Dense. The layer has no weights, so the Dense layers are what
    `fit` trains; the first one only gets a gradient through the sum with the encoding."""
    x = keras.Input(shape=(length, dim), name="x")
    inputs = [x]
    hidden = keras.layers.Dense(dim, name="project")(x)
    if with_positions:
        positions = keras.Input(shape=(length,), dtype="int32", name="positions")
        inputs.append(positions)
        encoding = layer(hidden, positions=positions)
    else:
        encoding = layer(hidden)
    outputs = keras.layers.Dense(3, name="head")(keras.ops.add(hidden, encoding))
    return keras.Model(inputs, outputs)


def test_build_has_no_weights(rng):
    layer = SinusoidalPositionEncoding()
    layer.build((2, 6, 8))
    assert layer.built
    assert count_params(layer) == 0 and layer.weights == []
    assert tuple(layer(embeddings(rng)).shape) == (2, 6, 8)
    assert layer.compute_output_shape((2, 6, 8)) == (2, 6, 8)


def test_config_round_trip():
    clone = check_config_round_trip(SinusoidalPositionEncoding(base=500.0, name="pe"))
    assert clone.base == 500.0 and clone.name == "pe"


@pytest.mark.parametrize("dim", [8, 5, 16])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_matches_reference(rng, dim, base):
    x = embeddings(rng, dim=dim)
    outputs = to_numpy(SinusoidalPositionEncoding(base=base)(x))
    expected = np.broadcast_to(ref.sinusoidal(6, dim, base=base), (2, 6, dim))
    np.testing.assert_allclose(outputs, expected, atol=1e-5)


def test_output_ignores_input_values(rng):
    layer = SinusoidalPositionEncoding()
    zeros = np.zeros((2, 6, 8), "float32")
    np.testing.assert_array_equal(to_numpy(layer(embeddings(rng))), to_numpy(layer(zeros)))


def test_shift_property_on_layer_outputs(rng):
    # Appendix A: the encoding of a window starting at μ is the first window times R(μ).
    x = embeddings(rng, length=6, dim=8)
    layer = SinusoidalPositionEncoding()
    first = to_numpy(layer(x)).astype("float64")
    for offset in (1, 2, 5):
        shifted = to_numpy(layer(x, start_index=offset))
        np.testing.assert_allclose(first @ ref.sinusoidal_shift_matrix(offset, 8), shifted, atol=1e-5)


@pytest.mark.parametrize("start_index", [0, 2, 7])
def test_start_index_matches_the_full_sequence(rng, start_index):
    # Cached decoding: the encoding of tokens [s, s + 2) equals rows s.. of the full encoding.
    layer = SinusoidalPositionEncoding()
    full = to_numpy(layer(embeddings(rng, length=start_index + 2)))
    step = to_numpy(layer(embeddings(rng, length=2), start_index=start_index))
    np.testing.assert_allclose(step, full[:, start_index : start_index + 2], atol=1e-6)
    np.testing.assert_allclose(step[0], ref.sinusoidal(2, 8, start=start_index), atol=1e-5)


def test_start_index_as_tensor(rng):
    layer = SinusoidalPositionEncoding()
    x = embeddings(rng, length=1)
    outputs = to_numpy(layer(x, start_index=keras.ops.convert_to_tensor(5, "int32")))
    np.testing.assert_allclose(outputs[:, 0], np.broadcast_to(ref.sinusoidal(1, 8, start=5), (2, 8)), atol=1e-5)


def test_positions_override(rng):
    layer = SinusoidalPositionEncoding()
    x = embeddings(rng, length=3)
    positions = np.array([[0, 1, 2], [4, 5, 6]], "int32")
    outputs = to_numpy(layer(x, positions=positions, start_index=3))  # positions win
    np.testing.assert_allclose(outputs[0], ref.sinusoidal(3, 8), atol=1e-5)
    np.testing.assert_allclose(outputs[1], ref.sinusoidal(3, 8, start=4), atol=1e-5)
    shared = to_numpy(layer(x, positions=np.array([2, 3, 4], "int32")))
    np.testing.assert_allclose(shared, np.broadcast_to(ref.sinusoidal(3, 8, start=2), (2, 3, 8)), atol=1e-5)


def test_fit_step(rng):
    model = encoder_model(SinusoidalPositionEncoding())
    check_fit_step(model, [embeddings(rng)])


def test_fit_step_through_wrapped_layer(rng):
    # The bare layer in a functional model: outputs are the table, whatever the input.
    x = embeddings(rng)
    model = wrap_in_model(SinusoidalPositionEncoding(), [x])
    np.testing.assert_allclose(model.predict(x, verbose=0)[0], ref.sinusoidal(6, 8), atol=1e-5)
    assert model.count_params() == 0


def test_saving(rng, tmp_path):
    model = encoder_model(SinusoidalPositionEncoding(base=300.0, name="pe"))
    loaded = check_saving(model, [embeddings(rng)], tmp_path)
    assert isinstance(loaded.get_layer("pe"), SinusoidalPositionEncoding)
    assert loaded.get_layer("pe").base == 300.0


def test_saving_with_positions_input(rng, tmp_path):
    model = encoder_model(SinusoidalPositionEncoding(), with_positions=True)
    positions = np.array([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]], "int32")
    check_saving(model, [embeddings(rng), positions], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = embeddings(rng)
    outputs = check_mixed_precision(SinusoidalPositionEncoding, [x], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    atol = 1e-2 if policy == "mixed_bfloat16" else 1e-3
    values = to_numpy(keras.ops.cast(outputs, "float32"))
    np.testing.assert_allclose(values, np.broadcast_to(ref.sinusoidal(6, 8), x.shape), atol=atol)


@xla_only
def test_jit_compile(rng):
    check_jit_compile(encoder_model(SinusoidalPositionEncoding()), [embeddings(rng)])


@xla_only
def test_jit_compile_with_positions(rng):
    positions = np.array([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]], "int32")
    model = encoder_model(SinusoidalPositionEncoding(), with_positions=True)
    check_jit_compile(model, [embeddings(rng), positions])


@pytest.mark.parametrize("base", [1, 1.0, 0.5, 0, -10.0])
def test_invalid_base(base):
    with pytest.raises(ValueError, match=f"base={base}"):
        SinusoidalPositionEncoding(base=base)


def test_rank_must_be_three(rng):
    with pytest.raises(ValueError, match=r"inputs_shape=\(2, 6\)"):
        SinusoidalPositionEncoding()(rng.normal(size=(2, 6)).astype("float32"))


@pytest.mark.parametrize("base", ["x", None, 0.5, -1])
def test_bad_base_raises(base):
    raises_naming("base", lambda: SinusoidalPositionEncoding(base=base))


@pytest.mark.parametrize(
    "positions",
    [
        pytest.param(np.arange(7), id="longer"),
        pytest.param(np.zeros((3, 6), "int32"), id="batch"),
        pytest.param(np.zeros((2, 6, 1), "int32"), id="rank3"),
    ],
)
def test_bad_positions_and_inputs_raise(rng, positions):
    layer = SinusoidalPositionEncoding()
    raises_naming("positions", lambda: layer(embeddings(rng), positions=positions))
    raises_naming("inputs", lambda: layer(rng.normal(size=(2, 6)).astype("float32")))
