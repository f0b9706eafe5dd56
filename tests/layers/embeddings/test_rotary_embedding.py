import keras
import numpy as np
import pytest

from keras_xf.layers import RotaryEmbedding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import xla_only
from tests.reference import positions as ref
from tests.layers.bad_inputs import raises_naming

SHAPE = (2, 6, 2, 8)  # [B, T, H, Dh]


def heads(rng, shape=SHAPE):
    return rng.normal(size=shape).astype("float32")


def rotary_model(layer, shape=SHAPE, with_positions=False):
    """x -> Dense -> RoPE -> Dense. RoPE has no weights; the first Dense only trains if the
    gradient flows back through the rotation."""
    x = keras.Input(shape=shape[1:], name="x")
    inputs = [x]
    hidden = keras.layers.Dense(shape[-1], name="project")(x)
    if with_positions:
        positions = keras.Input(shape=shape[1:2], dtype="int32", name="positions")
        inputs.append(positions)
        hidden = layer(hidden, positions=positions)
    else:
        hidden = layer(hidden)
    outputs = keras.layers.Dense(3, name="head")(hidden)
    return keras.Model(inputs, outputs)


def test_build_has_no_weights(rng):
    layer = RotaryEmbedding()
    layer.build(SHAPE)
    assert count_params(layer) == 0 and layer.weights == []
    assert tuple(layer(heads(rng)).shape) == SHAPE
    assert layer.compute_output_shape(SHAPE) == SHAPE


def test_config_round_trip():
    clone = check_config_round_trip(RotaryEmbedding(max_wavelength=500.0, scaling_factor=2.0, name="rope"))
    assert clone.max_wavelength == 500.0 and clone.scaling_factor == 2.0 and clone.name == "rope"


LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)


def test_llama3_frequency_scaling_matches_reference(rng):
    x = heads(rng, (2, 40, 2, 32))
    layer = RotaryEmbedding(max_wavelength=500.0, frequency_scaling=LLAMA3)
    frequencies = ref.llama3_frequencies(32, 500.0, **LLAMA3)
    # The short wavelengths are kept, the long ones stretched, some lie in between.
    plain = 500.0 ** (-np.arange(0, 32, 2) / 32)
    assert frequencies[0] == plain[0] and np.isclose(frequencies[-1], plain[-1] / 8)
    assert ((frequencies < plain) & (frequencies > plain / 8)).any()
    expected = ref.rotary(x, np.arange(40), frequencies=frequencies)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-4)
    clone = check_config_round_trip(layer)
    assert clone.frequency_scaling == LLAMA3


@pytest.mark.parametrize("scaling", [
    {"factor": 8.0}, dict(LLAMA3, factor=0.5), dict(LLAMA3, high_freq_factor=1.0),
    dict(LLAMA3, low_freq_factor=float("nan")), "llama3",
])
def test_invalid_frequency_scaling(scaling):
    with pytest.raises(ValueError, match="frequency_scaling"):
        RotaryEmbedding(frequency_scaling=scaling)


@pytest.mark.parametrize("max_wavelength,scaling_factor", [(10000.0, 1.0), (100.0, 1.0), (10000.0, 4.0)])
def test_matches_reference(rng, max_wavelength, scaling_factor):
    x = heads(rng)
    layer = RotaryEmbedding(max_wavelength=max_wavelength, scaling_factor=scaling_factor)
    expected = ref.rotary(x, np.arange(6), base=max_wavelength, scaling_factor=scaling_factor)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-5)


def test_half_split_layout(rng):
    # Feature k pairs with feature k + Dh/2 (not 2k with 2k+1): at position 1 with a base of
    # 10000 the first pair turns by exactly 1 radian.
    x = np.zeros((1, 2, 1, 8), "float32")
    x[..., 0] = 1.0
    out = to_numpy(RotaryEmbedding()(x))
    np.testing.assert_allclose(out[0, 1, 0, [0, 4]], [np.cos(1.0), np.sin(1.0)], atol=1e-6)
    np.testing.assert_allclose(np.delete(out[0, 1, 0], [0, 4]), 0.0, atol=1e-7)


@pytest.mark.parametrize("start_index", [1, 4])
def test_start_index_matches_the_full_sequence(rng, start_index):
    layer = RotaryEmbedding()
    x = heads(rng, (2, start_index + 2, 2, 8))
    full = to_numpy(layer(x))
    step = to_numpy(layer(x[:, start_index:], start_index=start_index))
    np.testing.assert_allclose(step, full[:, start_index:], atol=1e-6)
    tensor_step = to_numpy(layer(x[:, start_index:], start_index=keras.ops.convert_to_tensor(start_index)))
    np.testing.assert_allclose(tensor_step, full[:, start_index:], atol=1e-6)


def test_positions_per_batch_row(rng):
    x = heads(rng, (2, 3, 2, 8))
    positions = np.array([[0, 1, 2], [5, 6, 7]], "int32")
    out = to_numpy(RotaryEmbedding()(x, positions=positions, start_index=9))  # positions win
    np.testing.assert_allclose(out, ref.rotary(x, positions), atol=1e-5)


def test_rotate_hook_matches_calls(rng):
    layer = RotaryEmbedding(max_wavelength=1000.0)
    q = heads(rng, (2, 1, 4, 8))
    k = heads(rng, (2, 6, 2, 8))  # grouped-query: fewer key heads
    rq, rk = layer.rotate(q, k, np.array([5]), np.arange(6))
    np.testing.assert_allclose(to_numpy(rq), ref.rotary(q, [5], base=1000.0), atol=1e-5)
    np.testing.assert_allclose(to_numpy(rk), ref.rotary(k, np.arange(6), base=1000.0), atol=1e-5)


def test_rotate_hook_scores_depend_only_on_relative_position(rng):
    layer = RotaryEmbedding()
    q = heads(rng, (1, 1, 1, 8))
    k = heads(rng, (1, 1, 1, 8))

    def score(i, j):
        rq, rk = layer.rotate(q, k, np.array([i]), np.array([j]))
        return float(np.sum(to_numpy(rq) * to_numpy(rk)))

    for distance in (0, 2, 5):
        np.testing.assert_allclose([score(i + distance, i) for i in (0, 1, 3)], score(distance, 0), atol=1e-4)
    assert abs(score(4, 2) - score(4, 1)) > 1e-3


def test_cached_decoding_scores_equal_full_pass(rng):
    # The last query of a full pass, rotated at its position, against every key equals one
    # decoding step that rotates the new query alone with start_index = T - 1.
    layer = RotaryEmbedding()
    q = heads(rng, (2, 6, 1, 8))
    k = heads(rng, (2, 6, 1, 8))
    full_q, full_k = layer(q), layer(k)
    full = np.einsum("bhd,bshd->bhs", to_numpy(full_q)[:, -1], to_numpy(full_k))
    step_q = layer(q[:, -1:], start_index=5)
    step = np.einsum("bhd,bshd->bhs", to_numpy(step_q)[:, 0], to_numpy(full_k))
    np.testing.assert_allclose(step, full, atol=1e-5)


def test_fit_step(rng):
    model = rotary_model(RotaryEmbedding())
    project = model.get_layer("project").kernel
    before = to_numpy(project).copy()
    check_fit_step(model, [heads(rng)])
    # The gradient reached the Dense layer before RoPE, so it flows through the rotation.
    assert not np.allclose(before, to_numpy(project))


def test_saving(rng, tmp_path):
    model = rotary_model(RotaryEmbedding(max_wavelength=300.0, scaling_factor=2.0, name="rope"))
    loaded = check_saving(model, [heads(rng)], tmp_path)
    assert isinstance(loaded.get_layer("rope"), RotaryEmbedding)
    assert loaded.get_layer("rope").get_config() == model.get_layer("rope").get_config()


def test_saving_with_positions_input(rng, tmp_path):
    positions = np.array([[2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5]], "int32")
    check_saving(rotary_model(RotaryEmbedding(), with_positions=True), [heads(rng), positions], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = heads(rng)
    outputs = check_mixed_precision(RotaryEmbedding, [x], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    atol = 0.05 if policy == "mixed_bfloat16" else 5e-3
    values = to_numpy(keras.ops.cast(outputs, "float32"))
    np.testing.assert_allclose(values, ref.rotary(x, np.arange(6)), atol=atol)


@xla_only
def test_jit_compile(rng):
    check_jit_compile(rotary_model(RotaryEmbedding()), [heads(rng)])


@xla_only
def test_jit_compile_with_positions(rng):
    positions = np.array([[2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5]], "int32")
    check_jit_compile(rotary_model(RotaryEmbedding(), with_positions=True), [heads(rng), positions])


@pytest.mark.parametrize("max_wavelength", [1, 1.0, 0.5, -100.0])
def test_invalid_max_wavelength(max_wavelength):
    with pytest.raises(ValueError, match=f"max_wavelength={max_wavelength}"):
        RotaryEmbedding(max_wavelength=max_wavelength)


@pytest.mark.parametrize("scaling_factor", [0.5, 0, -1.0])
def test_invalid_scaling_factor(scaling_factor):
    with pytest.raises(ValueError, match=f"scaling_factor={scaling_factor}"):
        RotaryEmbedding(scaling_factor=scaling_factor)


def test_odd_head_dim_fails_at_build(rng):
    with pytest.raises(ValueError, match="head_dim=7"):
        RotaryEmbedding()(heads(rng, (2, 4, 2, 7)))


def test_odd_head_dim_fails_in_the_rotate_hook(rng):
    q = heads(rng, (2, 4, 2, 7))
    with pytest.raises(ValueError, match="head_dim=7"):
        RotaryEmbedding().rotate(q, q, np.arange(4), np.arange(4))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_wavelength": "x"}, "max_wavelength"),
        ({"max_wavelength": 0.5}, "max_wavelength"),
        ({"scaling_factor": None}, "scaling_factor"),
        ({"scaling_factor": 0.5}, "scaling_factor"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: RotaryEmbedding(**kwargs))


@pytest.mark.parametrize(
    "positions",
    [
        pytest.param(np.arange(SHAPE[1] + 1), id="longer"),
        pytest.param(np.zeros((SHAPE[0] + 1, SHAPE[1]), "int32"), id="batch"),
        pytest.param(np.zeros(SHAPE[:2] + (1,), "int32"), id="rank3"),
    ],
)
def test_bad_positions_raise(rng, positions):
    layer = RotaryEmbedding()
    raises_naming("positions", lambda: layer(heads(rng), positions=positions))
    query = keras.ops.convert_to_tensor(heads(rng))
    raises_naming("query_positions",
                  lambda: layer.rotate(query, query, positions, np.arange(SHAPE[1])))
    raises_naming("key_positions",
                  lambda: layer.rotate(query, query, np.arange(SHAPE[1]), positions))


def test_bad_inputs_raise(rng):
    raises_naming("inputs", lambda: RotaryEmbedding()(heads(rng, shape=(2, 6, 8))))
