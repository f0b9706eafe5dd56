import keras
import numpy as np
import pytest

from keras_xf.layers import LearnedPositionEmbedding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.layers.bad_inputs import raises_naming

TABLE, DIM = 8, 6


def make_layer(**kwargs):
    kwargs.setdefault("sequence_length", TABLE)
    return LearnedPositionEmbedding(**kwargs)


def embeddings(rng, batch=2, length=5, dim=DIM):
    return rng.normal(size=(batch, length, dim)).astype("float32")


def test_build_and_weight_count():
    layer = make_layer()
    layer.build((2, 5, DIM))
    assert count_params(layer) == TABLE * DIM
    assert len(layer.trainable_weights) == 1
    assert tuple(layer.position_embeddings.shape) == (TABLE, DIM)
    assert layer.compute_output_shape((2, 5, DIM)) == (2, 5, DIM)


def test_config_round_trip():
    layer = make_layer(initializer="zeros", name="pos")
    clone = check_config_round_trip(layer)
    assert clone.sequence_length == TABLE and clone.name == "pos"
    clone.build((2, 3, DIM))
    np.testing.assert_array_equal(to_numpy(clone.position_embeddings), 0.0)


def test_outputs_are_the_table_rows(rng):
    layer = make_layer()
    x = embeddings(rng)
    outputs = to_numpy(layer(x))
    table = to_numpy(layer.position_embeddings)
    assert outputs.shape == x.shape
    np.testing.assert_array_equal(outputs, np.broadcast_to(table[:5], x.shape))
    assert not np.allclose(outputs[:, 0], outputs[:, 1])


@pytest.mark.parametrize("start_index", [1, 3, TABLE - 2])
def test_start_index_matches_the_full_sequence(rng, start_index):
    # Cached decoding: rows [s, s + 2) of the table, equal to the full pass's slice.
    layer = make_layer()
    full = to_numpy(layer(embeddings(rng, length=start_index + 2)))
    step = to_numpy(layer(embeddings(rng, length=2), start_index=start_index))
    np.testing.assert_array_equal(step, full[:, start_index : start_index + 2])
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_array_equal(step[1], table[start_index : start_index + 2])


@pytest.mark.parametrize("length, dtype", [(1, "int32"), (3, "int64")])
def test_start_index_as_tensor(rng, length, dtype):
    # A tensor start (cached decoding, exported steps) reads rows [4, 4 + length) as an int.
    layer = make_layer()
    x = embeddings(rng, length=length)
    outputs = to_numpy(layer(x, start_index=keras.ops.convert_to_tensor(4, dtype)))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_array_equal(outputs, np.broadcast_to(table[4:4 + length], (2, length, DIM)))
    np.testing.assert_array_equal(outputs, to_numpy(layer(x, start_index=4)))


def test_fit_step(rng):
    layer = make_layer()
    x = embeddings(rng)
    model = wrap_in_model(layer, [x])
    before = to_numpy(layer.position_embeddings).copy()
    check_fit_step(model, [x])
    after = to_numpy(layer.position_embeddings)
    # Only the rows that were read get a gradient.
    assert not np.allclose(before[:5], after[:5])
    np.testing.assert_array_equal(before[5:], after[5:])


def test_saving(rng, tmp_path):
    x = embeddings(rng)
    inputs = keras.Input(shape=(5, DIM), name="x")
    outputs = keras.ops.add(inputs, make_layer(name="pos")(inputs))
    model = keras.Model(inputs, outputs)
    loaded = check_saving(model, [x], tmp_path)
    np.testing.assert_array_equal(
        to_numpy(loaded.get_layer("pos").position_embeddings),
        to_numpy(model.get_layer("pos").position_embeddings),
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    outputs = check_mixed_precision(make_layer, [embeddings(rng)], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    stepped = check_mixed_precision(
        make_layer, [embeddings(rng, length=2)], call_kwargs={"start_index": 3}, policy=policy
    )
    assert tuple(stepped.shape) == (2, 2, DIM)


@xla_only
def test_jit_compile(rng):
    x = embeddings(rng)
    inputs = keras.Input(shape=(5, DIM), name="x")
    hidden = keras.layers.Dense(DIM, name="project")(inputs)
    outputs = keras.ops.add(hidden, make_layer()(hidden))
    check_jit_compile(keras.Model(inputs, outputs), [x])


@pytest.mark.parametrize("value", [0, -4, 2.5, True, "8"])
def test_invalid_sequence_length(value):
    with pytest.raises(ValueError, match=f"sequence_length={value!r}"):
        LearnedPositionEmbedding(sequence_length=value)


def test_input_longer_than_the_table_fails_at_build(rng):
    layer = make_layer(sequence_length=4)
    with pytest.raises(ValueError, match="sequence_length=4") as info:
        layer(embeddings(rng, length=5))
    assert "positions up to 4" in str(info.value)


def test_input_longer_than_the_table_fails_when_tracing_a_model():
    inputs = keras.Input(shape=(6, DIM))
    with pytest.raises(ValueError, match="sequence_length=4"):
        make_layer(sequence_length=4)(inputs)


def test_start_index_past_the_table_fails(rng):
    layer = make_layer(sequence_length=4)
    layer(embeddings(rng, length=4))  # a full table is fine
    with pytest.raises(ValueError, match="positions up to 5 with sequence_length=4"):
        layer(embeddings(rng, length=3), start_index=3)


def test_rank_must_be_three(rng):
    with pytest.raises(ValueError, match=r"inputs_shape=\(2, 5\)"):
        make_layer()(rng.normal(size=(2, 5)).astype("float32"))


def test_bad_inputs_and_initializer_raise(rng):
    layer = make_layer()
    layer(embeddings(rng))
    raises_naming("inputs", lambda: layer(embeddings(rng, dim=DIM + 2)))
    raises_naming("initializer", lambda: make_layer(initializer="not_an_initializer"))
