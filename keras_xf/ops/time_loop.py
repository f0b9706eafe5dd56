"""The loop over time behind `keras_xf.ops.scan` and `keras_xf.ops.cross_entropy`: a
`keras.ops.scan` whose TensorFlow and PyTorch forms are written here, since Keras's forms of
those two backends cost time quadratic in the number of steps (see `time_loop`).

Backend-specific code beside the concern it serves: the loop is the one piece of the scans
that `keras.ops` cannot express at linear cost.
"""

import keras
from keras import ops


def time_loop(step, init, xs, output_index=1, sequential=False):
    """`keras.ops.scan` over the leading (time) axis of `xs`, returning `(carry, ys)` with `ys`
    shaped like `xs[output_index]`.

    `sequential=True` runs one step at a time where the backend would otherwise overlap the
    work of consecutive steps that does not depend on the carry: TensorFlow's graph
    `while_loop` starts up to 10 iterations at once, so a loop whose point is that only one
    step's buffers exist at a time (`chunked_cross_entropy`'s `[C, V]` blocks) would hold
    several. XLA, `lax.scan` and PyTorch's Python loop run one step at a time already.

    Why not `keras.ops.scan` alone: its TensorFlow and PyTorch forms have the costs below.
    On TensorFlow the loop is a `while_loop` with `maximum_iterations` (Keras's TensorFlow
    `scan` has no iteration bound, and XLA cannot differentiate an unbounded loop): under XLA
    it writes into a buffer (`_write_step`), elsewhere it reads and writes `TensorArray`s
    (`_tensor_array_loop`). On PyTorch it is a Python loop over `ops.unstack`
    slices: the slices `x[i]` of Keras's PyTorch `scan` each send back a gradient the size of
    the whole `x`, so its backward pass was quadratic in the number of steps. JAX uses
    `keras.ops.scan` (`lax.scan`). A leading axis unknown at trace time (a TensorFlow graph
    traced with a free batch size) is read from the tensor's shape when the loop runs.
    """
    name = keras.config.backend()
    if name == "torch":
        carry, ys = init, []
        for inputs in zip(*(ops.unstack(x, axis=0) for x in xs)):
            carry, y = step(carry, tuple(inputs))
            ys.append(y)
        return carry, ops.stack(ys, axis=0)
    if name != "tensorflow":
        return ops.scan(step, init, xs)
    length = _leading_length(xs[0])
    if not _in_xla_context():
        return _tensor_array_loop(step, init, xs, output_index, 1 if sequential else 10)

    def body(index, carry, buffer):
        carry, y = step(carry, tuple(ops.take(x, index, axis=0) for x in xs))
        return index + 1, carry, _write_step(buffer, index, y)

    _, carry, ys = ops.while_loop(
        lambda index, carry, buffer: index < length,
        body,
        (ops.convert_to_tensor(0, "int32"), init, ops.zeros_like(xs[output_index])),
        maximum_iterations=length,
    )
    return carry, ys


def _leading_length(x):
    """The length of `x`'s first axis: an int, or a scalar tensor where it is unknown."""
    length = x.shape[0]
    return length if isinstance(length, int) else ops.shape(x)[0]


def _in_xla_context():
    """Whether TensorFlow is tracing for XLA (`tf.function(jit_compile=True)`, which is what
    Keras's `jit_compile=True` uses): the graph or one of its outer graphs is in an XLA
    control-flow context. Where TensorFlow's module has moved, the loop takes the form that
    serves both (the scatter of `_write_step`)."""
    import tensorflow as tf

    try:
        from tensorflow.python.ops import control_flow_util

        return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):
        return True


def _tensor_array_loop(step, init, xs, output_index, parallel_iterations):
    """The time loop of TensorFlow's graphs without XLA (Keras's `fit` on a CPU-only
    TensorFlow, eager calls): the inputs are read from `TensorArray`s and the outputs written
    into one. There a step's slice `x[i]` of a captured tensor sends back a gradient the size
    of the whole `x` (a dense sum at every backward step), and the scatter of `_write_step`
    copies the whole buffer at every forward step, so both grew with the square of the number
    of steps; a `TensorArray` reads, writes and sends back one step at a time."""
    import tensorflow as tf

    length = _leading_length(xs[0])
    inputs = [
        tf.TensorArray(x.dtype, size=length, element_shape=x.shape[1:]).unstack(x) for x in xs
    ]
    target = xs[output_index]
    outputs = tf.TensorArray(target.dtype, size=length, element_shape=target.shape[1:])

    def body(index, carry, outputs):
        carry, y = step(carry, tuple(x.read(index) for x in inputs))
        return index + 1, carry, outputs.write(index, y)

    _, carry, outputs = tf.while_loop(
        lambda index, carry, outputs: index < length,
        body,
        (tf.constant(0, "int32"), init, outputs),
        maximum_iterations=length,
        parallel_iterations=parallel_iterations,
    )
    return carry, outputs.stack()


_WRITE_GRADIENT = "KerasXfTimeLoopWrite"
_write_gradient_registered = []


def _write_step(buffer, index, value):
    """`buffer[index] = value` in TensorFlow's time loop: a scatter (differentiable in
    TensorFlow, unlike its dynamic update slice) whose gradient passes the buffer's gradient
    on unchanged. The exact gradient zeroes slot `index` first, but the loop writes each slot
    once into a buffer of zeros, so that slot's gradient reaches only the constant initial
    buffer. Zeroing it made XLA copy the whole gradient buffer at every backward step (a read
    and an in-place write of the same loop-carried buffer), so the compiled backward pass grew
    with the square of the number of steps. The gradient is overridden by the op's name for
    this scatter only."""
    import tensorflow as tf

    if not _write_gradient_registered:
        try:

            @tf.RegisterGradient(_WRITE_GRADIENT)
            def _gradient(op, upstream):
                return upstream, None, tf.gather_nd(upstream, op.inputs[1])

        except KeyError:  # registered already (this module imported twice)
            pass
        _write_gradient_registered.append(True)
    indices = tf.reshape(index, (1, 1))
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"TensorScatterUpdate": _WRITE_GRADIENT}):
        return tf.tensor_scatter_nd_update(buffer, indices, value[None])
