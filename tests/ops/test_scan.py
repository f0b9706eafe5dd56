"""Linear recurrences: the sequential, associative and chunked scans against a naive loop."""

import keras
import numpy as np
import pytest

from keras_xf import ops as xf_ops
from keras_xf.ops.scan import associative_scan
from keras_xf.ops.scan import chunked_scan
from keras_xf.ops.scan import linear_recurrence
from keras_xf.ops.scan import prefix_scan
from keras_xf.ops.scan import scan_chunks
from keras_xf.ops.scan import sequential_scan
from tests import layer_checks as checks
from tests.reference import scan as reference

METHODS = [
    ("sequential", {}),
    ("associative", {}),
    ("chunked", {"chunk_size": 4}),  # 11 steps: two full chunks and a padded one
    ("chunked", {"chunk_size": 16}),  # a single padded chunk
]


def _inputs(rng, shape=(2, 11, 3, 2)):
    a = rng.uniform(0.5, 1.0, size=shape).astype("float32")
    b = rng.normal(size=shape).astype("float32")
    z0 = rng.normal(size=(shape[0],) + shape[2:]).astype("float32")
    return a, b, z0


@pytest.mark.parametrize("method,kwargs", METHODS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_methods_match_the_naive_loop(rng, method, kwargs, with_initial_state):
    a, b, z0 = _inputs(rng)
    z0 = z0 if with_initial_state else None
    z = linear_recurrence(a, b, initial_state=z0, method=method, **kwargs)
    expected = reference.linear_recurrence(a, b, z0)
    np.testing.assert_allclose(checks.to_numpy(z), expected, rtol=1e-5, atol=1e-5)


def test_named_functions_equal_the_entry_point(rng):
    a, b, z0 = _inputs(rng)
    expected = reference.linear_recurrence(a, b, z0)
    for fn in (sequential_scan, associative_scan, lambda *x: chunked_scan(*x, chunk_size=3)):
        np.testing.assert_allclose(checks.to_numpy(fn(a, b, z0)), expected, rtol=1e-5, atol=1e-5)
    assert xf_ops.linear_recurrence is linear_recurrence


@pytest.mark.parametrize("length", [1, 2, 8])
def test_short_and_power_of_two_lengths(rng, length):
    a, b, z0 = _inputs(rng, shape=(2, length, 3))
    for method in ("sequential", "associative", "chunked"):
        z = linear_recurrence(a, b, initial_state=z0, method=method, chunk_size=3)
        np.testing.assert_allclose(
            checks.to_numpy(z), reference.linear_recurrence(a, b, z0), rtol=1e-5, atol=1e-5
        )


def test_decay_broadcasts_against_the_inputs(rng):
    _, b, _ = _inputs(rng)
    a = rng.uniform(0.5, 1.0, size=(1, 11, 3, 1)).astype("float32")
    for method in ("sequential", "associative", "chunked"):
        z = linear_recurrence(a, b, method=method, chunk_size=5)
        np.testing.assert_allclose(
            checks.to_numpy(z), reference.linear_recurrence(a, b), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("method", ["sequential", "associative", "chunked"])
def test_bfloat16_inputs_accumulate_in_float32(rng, method):
    # 64 steps of a decay close to 1: z_t = Σ_k a^k would drift if accumulated in bfloat16.
    shape = (1, 64, 2)
    a = np.full(shape, 0.99, "float32")
    b = np.full(shape, 0.5, "float32")
    z = linear_recurrence(
        keras.ops.cast(a, "bfloat16"), keras.ops.cast(b, "bfloat16"), method=method, chunk_size=8
    )
    assert keras.backend.standardize_dtype(z.dtype) == "bfloat16"
    expected = reference.linear_recurrence(
        checks.to_numpy(keras.ops.cast(keras.ops.cast(a, "bfloat16"), "float32")), b
    )
    # The only errors are the bfloat16 rounding of the decay and of the result (8 bits).
    np.testing.assert_allclose(
        checks.to_numpy(keras.ops.cast(z, "float32")), expected, rtol=1e-2
    )


@checks.xla_only
@pytest.mark.parametrize("method", ["sequential", "associative", "chunked"])
def test_compiles_and_differentiates_under_xla(rng, method):
    a, b, z0 = _inputs(rng)

    class Recurrence(keras.layers.Layer):
        def build(self, *shapes):
            self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

        def call(self, a, b, z0):
            return linear_recurrence(a * self.scale, b, initial_state=z0, method=method,
                                     chunk_size=4)

    model = checks.wrap_in_model(Recurrence(), [a, b, z0])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    z = model.predict([a, b, z0], verbose=0)
    np.testing.assert_allclose(z, reference.linear_recurrence(a, b, z0), rtol=1e-5, atol=1e-5)
    before = float(checks.to_numpy(model.weights[0]))
    model.fit([a, b, z0], np.zeros_like(b), epochs=1, batch_size=2, verbose=0)
    assert float(checks.to_numpy(model.weights[0])) != before


def test_prefix_scan_gives_the_products_and_the_states_from_zero(rng):
    a, b, _ = _inputs(rng, shape=(2, 7, 3))
    products, states = prefix_scan(a, b)
    np.testing.assert_allclose(checks.to_numpy(products), np.cumprod(a, axis=1), rtol=1e-5)
    np.testing.assert_allclose(
        checks.to_numpy(states), reference.linear_recurrence(a, b), rtol=1e-5, atol=1e-5
    )
    assert xf_ops.prefix_scan is prefix_scan


@pytest.mark.parametrize("chunk_size", [3, 4, 16])  # padded chunks, exact chunks, one chunk
def test_scan_chunks_carries_the_state_across_chunks(rng, chunk_size):
    # The chunked recurrence written with prefix_scan inside each chunk: z = ẑ + P·h.
    a, b, z0 = _inputs(rng, shape=(2, 12, 3))
    valid = np.ones((2, 12, 1), "float32")

    def step(state, chunk):
        a_c, b_c, valid_c = chunk
        a_c = keras.ops.where(valid_c > 0, a_c, 1.0)  # the zero padding holds the state
        products, states = prefix_scan(a_c, b_c)
        states = states + products * state[:, None]
        return states[:, -1], states

    final, z = scan_chunks(step, keras.ops.convert_to_tensor(z0), (a, b, valid), chunk_size)
    expected = reference.linear_recurrence(a, b, z0)
    np.testing.assert_allclose(checks.to_numpy(z), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(checks.to_numpy(final), expected[:, -1], rtol=1e-5, atol=1e-5)
    assert xf_ops.scan_chunks is scan_chunks


def test_scan_chunks_outputs_take_the_shape_of_the_first_sequence(rng):
    x = rng.normal(size=(2, 5, 3)).astype("float32")
    extra = rng.normal(size=(2, 5, 4, 2)).astype("float32")

    def step(total, chunk):
        x_c, extra_c = chunk
        increments = x_c + keras.ops.sum(extra_c, axis=(2, 3))[..., None]
        running = total[:, None] + keras.ops.cumsum(increments, axis=1)
        return running[:, -1], running

    total, y = scan_chunks(step, keras.ops.zeros((2, 3)), (x, extra), 2)
    expected = np.cumsum(x + extra.sum((2, 3))[..., None], axis=1)
    np.testing.assert_allclose(checks.to_numpy(y), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="chunk_size=0"):
        scan_chunks(step, keras.ops.zeros((2, 3)), (x, extra), 0)


def test_bad_arguments_raise():
    a = np.ones((1, 4, 2), "float32")
    with pytest.raises(ValueError, match="method=.*'parallel'"):
        linear_recurrence(a, a, method="parallel")
    with pytest.raises(ValueError, match="chunk_size=0"):
        linear_recurrence(a, a, method="chunked", chunk_size=0)
    with pytest.raises(ValueError, match="same rank"):
        linear_recurrence(np.ones((4, 2), "float32"), a)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_scan_chunks_gradients_equal_a_cumulative_sum(rng, jit_compile):
    """`scan_chunks` (a running sum, chunk by chunk) differentiates like `cumsum`: every chunk's
    output reaches the inputs of its own and earlier chunks, compiled and not (TensorFlow's
    loop without XLA reads and writes `TensorArray`s)."""
    x = rng.normal(size=(2, 10, 3)).astype("float32")
    weights = rng.normal(size=x.shape).astype("float32")

    def step(total, chunk):
        (values,) = chunk
        running = total[:, None] + keras.ops.cumsum(values, axis=1)
        return running[:, -1], running * running

    def chunked(x):
        _, y = scan_chunks(step, keras.ops.zeros((2, 3)), (x,), 4)
        return keras.ops.sum(y * keras.ops.convert_to_tensor(weights))

    def direct(x):
        y = keras.ops.cumsum(x, axis=1)
        return keras.ops.sum(y * y * keras.ops.convert_to_tensor(weights))

    value, (grad,) = checks.value_and_gradients(chunked, [x], jit_compile)
    expected_value, (expected,) = checks.value_and_gradients(direct, [x])
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)
