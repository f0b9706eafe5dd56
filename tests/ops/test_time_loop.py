"""`time_loop`, the loop over time behind the scans and the chunked cross-entropy: its values
and gradients against the loop-free associative scan and a cumulative sum, and the form it
takes on TensorFlow with and without XLA."""

import keras
import numpy as np
import pytest

from keras_xf.ops.scan import linear_recurrence
from keras_xf.ops.scan import sequential_scan
from keras_xf.ops.time_loop import time_loop
from tests import layer_checks as checks
from tests.reference import scan as reference


def _inputs(rng, shape):
    a = rng.uniform(0.5, 1.0, size=shape).astype("float32")
    b = rng.normal(size=shape).astype("float32")
    z0 = rng.normal(size=(shape[0],) + shape[2:]).astype("float32")
    return a, b, z0


@pytest.mark.parametrize("sequential", [False, True])
def test_time_loop_carries_the_state_and_stacks_the_outputs(rng, sequential):
    """`(carry, ys)` with the running sum as carry and, per step, the carry times the second
    sequence: `ys` takes the shape of `xs[output_index]`."""
    x = rng.normal(size=(5, 2, 3)).astype("float32")
    w = rng.normal(size=(5, 2, 3)).astype("float32")

    def step(carry, inputs):
        x_t, w_t = inputs
        carry = carry + x_t
        return carry, carry * w_t

    carry, ys = time_loop(step, keras.ops.zeros((2, 3)), (keras.ops.convert_to_tensor(x),
                                                          keras.ops.convert_to_tensor(w)),
                          output_index=1, sequential=sequential)
    running = np.cumsum(x, axis=0)
    np.testing.assert_allclose(checks.to_numpy(carry), running[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(checks.to_numpy(ys), running * w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_time_loop_gradients_equal_the_associative_scans(rng, jit_compile):
    """The time loop behind the sequential scan and `scan_chunks` writes its outputs with a
    gradient of its own on TensorFlow (`_write_step`); its values and gradients, compiled and
    not, equal those of the associative scan, which has no loop."""
    a, b, z0 = _inputs(rng, (2, 12, 3))
    weights = rng.normal(size=b.shape).astype("float32")

    def loss(method):
        def function(a, b, z0):
            z = linear_recurrence(a, b, initial_state=z0, method=method)
            return keras.ops.sum(z * keras.ops.convert_to_tensor(weights))

        return function

    value, grads = checks.value_and_gradients(loss("sequential"), [a, b, z0], jit_compile)
    expected_value, expected_grads = checks.value_and_gradients(loss("associative"), [a, b, z0])
    np.testing.assert_allclose(
        value, np.sum(reference.linear_recurrence(a, b, z0) * weights), rtol=1e-5)
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    for grad, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)



def _graph_op_types(concrete):
    """Every op type of a concrete TensorFlow function, its loop bodies and gradients included."""
    graph_def = concrete.graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
    return types


@pytest.mark.skipif(keras.config.backend() != "tensorflow",
                    reason="the two forms of the time loop are TensorFlow's (JAX runs lax.scan, "
                           "PyTorch a Python loop)")
@pytest.mark.parametrize("jit_compile", [True, False])
def test_tensorflow_time_loop_form_follows_xla(rng, jit_compile):
    """Under XLA the loop writes by scatter (linear there, `_write_step`); without XLA, where a
    scatter copies its whole buffer and the gradient of a slice of a captured input is summed
    densely at every step, it reads and writes `TensorArray`s. Both differentiate alike."""
    import tensorflow as tf

    x = tf.constant(rng.normal(size=(2, 10, 3)).astype("float32"))

    @tf.function(jit_compile=jit_compile)
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sequential_scan(keras.ops.full_like(x, 0.5), x)
            value = tf.reduce_sum(y * y)
        return tape.gradient(value, x)

    types = _graph_op_types(gradient.get_concrete_function(x))
    if jit_compile:
        assert "TensorScatterUpdate" in types
        assert not {"TensorListGetItem", "TensorListSetItem"} & types
    else:
        assert "TensorScatterUpdate" not in types and "UnsortedSegmentSum" not in types
        assert {"TensorListGetItem", "TensorListSetItem"} <= types
    expected = tf.function(gradient.python_function, jit_compile=not jit_compile)(x)
    np.testing.assert_allclose(gradient(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
