"""The code of keras_xf that `keras.ops` cannot express: every branch on the backend and every
direct use of TensorFlow, JAX or PyTorch lives here (`keras_xf/export/` aside), so that the
rest of the library is written once against `keras.ops`.

Each function says why `keras.ops` is not enough for it. Backends other than the three that
keras_xf tests take the `keras.ops` form wherever one exists.
"""

import contextlib
import threading

import keras
from keras import ops


def _backend():
    """The name of the Keras backend: the one place the library reads it."""
    return keras.config.backend()


# Attention ------------------------------------------------------------------------------


def dot_product_attention(query, key, value, mask, bias, scale):
    """The fused attention kernel on `[B, T, H, Dh]` queries and `[B, S, Hkv, Dh]` keys/values.

    Why not `keras.ops.dot_product_attention` alone: on PyTorch it makes contiguous copies of
    the transposed keys and values first; reading a cache `[B, 2, L, Hkv, Dh]` that costs two
    copies of the whole cache per layer and step. PyTorch's `scaled_dot_product_attention`
    takes the strided views as they are. Elsewhere it is `keras.ops.dot_product_attention`.
    `mask` and `bias` are not both given (PyTorch's kernel takes one of them).

    Flash kernels follow Keras's global switch, as Keras's and keras-hub's attention layers
    do: by default (and after `keras.config.enable_flash_attention()`) Keras takes its flash
    kernel where the platform has one (cuDNN on an Ampere or later GPU with bfloat16 or
    float16 inputs, Splash attention on a TPU) and its plain kernel elsewhere;
    `keras.config.disable_flash_attention()` keeps the plain kernel everywhere. PyTorch's
    `scaled_dot_product_attention` chooses among its own fused kernels (flash,
    memory-efficient, cuDNN) by the inputs and the device.
    """
    if _backend() == "torch":
        return _torch_attention(query, key, value, mask, bias, scale)
    # None (Keras's default) lets Keras choose; False is the user's `disable_flash_attention`.
    return ops.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale,
        flash_attention=keras.config.is_flash_attention_enabled(),
    )


def _torch_attention(query, key, value, mask, bias, scale):
    import torch.nn.functional as F

    # Imported here: keras_xf.ops.attention imports this module.
    from keras_xf.ops.attention import repeat_kv_heads

    key = repeat_kv_heads(key, query.shape[2])
    value = repeat_kv_heads(value, query.shape[2])
    query, key, value = (ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
    outputs = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask if bias is None else bias, scale=scale
    )
    return ops.transpose(outputs, (0, 2, 1, 3))


# Attention caches -----------------------------------------------------------------------

_state = threading.local()


@contextlib.contextmanager
def cache_updates_in_place():
    """Within this context, on PyTorch, `keras_xf.ops.cache.update_cache` writes into the
    cache it is given instead of returning an updated copy.

    Why not `keras.ops.slice_update`: it is functional (a new tensor), and PyTorch has no
    compiler that turns it into an in-place write. The decoding loop of `generate` uses this
    context while it records its TorchScript step: the loop owns its cache and never reads an
    old one again, and a copy of every layer's cache at every step costs more memory traffic
    than the step's arithmetic at small batch sizes. On TensorFlow and JAX, XLA updates loop
    buffers in place itself, and the functional write is kept.
    """
    previous = getattr(_state, "in_place", False)
    _state.in_place = True
    try:
        yield
    finally:
        _state.in_place = previous


def writes_cache_in_place():
    """Whether `update_cache` is inside `cache_updates_in_place` on PyTorch."""
    return getattr(_state, "in_place", False) and _backend() == "torch"


def write_cache_in_place(cache, update, index):
    """`cache[:, :, index : index + t] = update` in place (PyTorch's `index_copy_`), returning
    `cache`: `keras.ops` has no in-place write (see `cache_updates_in_place`). A cache that
    is a broadcast view (stride 0, e.g. one row repeated for the beams of a beam search) is
    copied into memory of its own first, once: several of its elements share one location."""
    import torch

    if any(stride == 0 and size > 1 for stride, size in zip(cache.stride(), cache.shape)):
        cache = cache.contiguous()

    positions = torch.arange(update.shape[2], device=cache.device) + torch.as_tensor(
        index, device=cache.device
    ).to(torch.int64)
    return cache.index_copy_(2, positions, update)


# Time loops (keras_xf.ops.scan) ---------------------------------------------------------


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
    name = _backend()
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


# Mixture of experts ---------------------------------------------------------------------


def grouped_matmul(x, w):
    """`x[g] @ w[g]` for `x [G, R, a]`, `w [G, a, b]`.

    Why not `keras.ops.matmul` alone: TensorFlow's CPU `BatchMatMulV2` kernel takes more time
    per FLOP than its `MatMul`, so on TensorFlow a few groups run as one `MatMul` each (a
    batched matmul elsewhere)."""
    groups = x.shape[0]
    if _backend() == "tensorflow" and isinstance(groups, int) and groups <= 64:
        return ops.stack([ops.matmul(a, b) for a, b in zip(ops.unstack(x, groups, axis=0),
                                                            ops.unstack(w, groups, axis=0))])
    return ops.matmul(x, w)


# Reversible layers ------------------------------------------------------------------------


def vjp(function, primals):
    """`(outputs, pullback)`: `outputs = function(*primals)` (one tensor) and a function that
    maps a cotangent of `outputs` to the gradients of all `primals` (zeros for a primal that
    does not reach `outputs`).

    Why not `keras.ops`: Keras has no vector-Jacobian product. A reversible stack's custom
    gradient (`keras.ops.custom_gradient`) recomputes each block's sub-layers from the
    block's outputs and needs their gradients with respect to their inputs and weights;
    each backend's own autodiff gives them (`jax.vjp`, a `tf.GradientTape`, and
    `torch.autograd.grad` with gradients enabled, as PyTorch runs a custom backward without).
    """
    backend = _backend()
    if backend == "jax":
        import jax

        outputs, pullback = jax.vjp(function, *primals)
        return outputs, lambda cotangent: tuple(pullback(ops.cast(cotangent, outputs.dtype)))
    if backend == "tensorflow":
        import tensorflow as tf

        primals = list(primals)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for primal in primals:
                tape.watch(primal)
            outputs = function(*primals)

        def tf_pullback(cotangent):
            return tuple(tape.gradient(outputs, primals,
                                       output_gradients=ops.cast(cotangent, outputs.dtype),
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO))

        return outputs, tf_pullback
    if backend == "torch":
        import torch

        with torch.enable_grad():
            leaves = [primal.detach().requires_grad_() for primal in primals]
            outputs = function(*leaves)

        def torch_pullback(cotangent):
            grads = torch.autograd.grad(outputs, leaves, ops.cast(cotangent, outputs.dtype),
                                        allow_unused=True)
            return tuple(torch.zeros_like(leaf) if grad is None else grad
                         for grad, leaf in zip(grads, leaves))

        return outputs, torch_pullback
    raise ValueError(
        "vjp (the custom gradient of reversible layers) supports the tensorflow, jax and "
        f"torch backends. Received: backend={backend!r}")
