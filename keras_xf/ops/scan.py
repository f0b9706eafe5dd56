"""Linear recurrences `z_t = a_t ⊙ z_{t−1} + b_t` over time (survey §5.5).

State-space models (§5.5.3) and linear attention with decay (§5.5.2) both reduce to a
first-order linear recurrence along the sequence axis. Three equal ways to compute it:

- `sequential_scan`: a compiled loop over time (`keras.ops.scan`), `O(T)` steps;
- `associative_scan`: a parallel prefix scan with the associative combine
  `(a₁, b₁) ∘ (a₂, b₂) = (a₁·a₂, a₂·b₁ + b₂)`, `O(log T)` depth;
- `chunked_scan`: the associative scan inside chunks of `chunk_size` steps and a
  sequential scan over the chunk boundaries.

Inputs are `[B, T, ...]` tensors with time on axis 1; `a` broadcasts against `b`. Under mixed
precision the recurrence is accumulated in float32 (the inputs are cast in and the result is
cast back to the dtype of `b`), so that long products of decays do not underflow in float16
or lose precision in bfloat16.
"""

import keras
from keras import ops

from keras_xf.ops.time_loop import time_loop

METHODS = ("associative", "sequential", "chunked")

_LOW_PRECISION = ("float16", "bfloat16")


def _prepare(a, b, initial_state):
    b = ops.convert_to_tensor(b)
    out_dtype = keras.backend.standardize_dtype(b.dtype)
    compute_dtype = "float32" if out_dtype in _LOW_PRECISION else out_dtype
    b = ops.cast(b, compute_dtype)
    a = ops.cast(ops.convert_to_tensor(a), compute_dtype)
    if len(a.shape) != len(b.shape):
        raise ValueError(
            "a and b must have the same rank (a broadcasts against b). "
            f"Received: a.shape={a.shape}, b.shape={b.shape}"
        )
    if len(b.shape) < 2:
        raise ValueError(f"b must be [batch, time, ...]. Received: b.shape={b.shape}")
    a = a + ops.zeros_like(b)
    if initial_state is not None:
        initial_state = ops.cast(ops.convert_to_tensor(initial_state), compute_dtype)
    return a, b, initial_state, out_dtype


def _fold_initial_state(a, b, initial_state):
    """`z_1 = a_1 z_0 + b_1`: the initial state enters through the first `b`."""
    if initial_state is None:
        return b
    first = a[:, :1] * ops.expand_dims(initial_state, 1) + b[:, :1]
    return ops.concatenate([first, b[:, 1:]], axis=1)


def _combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def _sequential(a, b, initial_state):
    """Loop over time (moved to the leading axis)."""
    perm = [1, 0] + list(range(2, len(b.shape)))
    a_t = ops.transpose(a, perm)
    b_t = ops.transpose(b, perm)
    init = ops.zeros_like(b_t[0]) if initial_state is None else initial_state + ops.zeros_like(b_t[0])

    def step(state, inputs):
        a_step, b_step = inputs
        state = a_step * state + b_step
        return state, state

    _, states = time_loop(step, init, (a_t, b_t))
    return ops.transpose(states, perm)


def _prefix_scan(a, b):
    """Inclusive prefix of `(a_t, b_t)` under `_combine` along axis 1, static length.

    The odd/even recursion of Blelloch (as in `jax.lax.associative_scan`): combine neighbouring
    pairs, scan the half-length sequence, then fill in the even positions; `O(T)` work and
    `O(log T)` depth. Pairs are formed by reshaping (an odd length gets one identity step,
    `a = 1, b = 0`), so that every backend sees static shapes and only reshapes, unstacks and
    splits (Keras's TensorFlow `associative_scan` does not compile under XLA).
    """
    length = b.shape[1]
    if length is None:
        raise ValueError(
            "The associative scan needs a static sequence length. Received: b.shape="
            f"{b.shape}; use method='sequential' for a dynamic length"
        )
    length = int(length)  # an int also while PyTorch traces (a shape tensor there)
    if length < 2:
        return a, b
    tail = list(b.shape[2:])
    even_length = length + length % 2
    if length % 2:
        a = ops.concatenate([a, ops.ones_like(a[:, :1])], axis=1)
        b = ops.concatenate([b, ops.zeros_like(b[:, :1])], axis=1)
    half = even_length // 2
    # Unstacked and split rather than sliced: in TensorFlow's graphs without XLA the gradient
    # of a slice fills a zero tensor of the whole input, at every level and chunk.
    a_even, a_odd = ops.unstack(ops.reshape(a, [-1, half, 2] + tail), num=2, axis=2)
    b_even, b_odd = ops.unstack(ops.reshape(b, [-1, half, 2] + tail), num=2, axis=2)
    # Prefixes ending at the odd positions 1, 3, 5, ...
    odd_a, odd_b = _prefix_scan(*_combine((a_even, b_even), (a_odd, b_odd)))
    # Prefixes ending at the even positions 0, 2, 4, ...: the previous odd prefix (the
    # identity before position 0), then the element.
    previous_a = ops.concatenate([ops.ones_like(odd_a[:, :1]), _drop_last(odd_a)], axis=1)
    previous_b = ops.concatenate([ops.zeros_like(odd_b[:, :1]), _drop_last(odd_b)], axis=1)
    even_a, even_b = _combine((previous_a, previous_b), (a_even, b_even))

    def interleave(even, odd):
        merged = ops.reshape(ops.stack([even, odd], axis=2), [-1, even_length] + tail)
        return _drop_last(merged) if length % 2 else merged

    return interleave(even_a, odd_a), interleave(even_b, odd_b)


def _drop_last(x):
    """`x[:, :-1]`, as a split (see `_prefix_scan`)."""
    return ops.split(x, [x.shape[1] - 1], axis=1)[0]


def _associative(a, b, initial_state):
    b = _fold_initial_state(a, b, initial_state)
    _, z = _prefix_scan(a, b)
    return z


def _chunk_layout(x, chunk_size, caller):
    """`(length, number of chunks, padding steps)` for the static length of `x` (axis 1)."""
    length = x.shape[1]
    if length is None:
        raise ValueError(
            f"{caller} needs a static sequence length. Received: shape={x.shape}; use "
            "method='sequential' of linear_recurrence for a dynamic length"
        )
    length = int(length)  # an int also while PyTorch traces (a shape tensor there)
    num_chunks = -(-length // chunk_size)
    return length, num_chunks, num_chunks * chunk_size - length


def _chunked(a, b, initial_state, chunk_size):
    length, num_chunks, pad = _chunk_layout(b, chunk_size, "chunked_scan")
    if pad:
        # Identity steps (a = 1, b = 0) at the end leave the earlier states unchanged.
        widths = [(0, 0), (0, pad)] + [(0, 0)] * (len(b.shape) - 2)
        a = ops.pad(a, widths, constant_values=1.0)
        b = ops.pad(b, widths)
    tail = list(b.shape[2:])
    shape = [-1, num_chunks, chunk_size] + tail
    a_c = ops.reshape(a, shape)
    b_c = ops.reshape(b, shape)
    # Inside each chunk, in parallel: prefix products of `a` and states started from zero.
    flat = [-1, chunk_size] + tail
    a_prefix, z_local = _prefix_scan(ops.reshape(a_c, flat), ops.reshape(b_c, flat))
    a_prefix = ops.reshape(a_prefix, shape)
    z_local = ops.reshape(z_local, shape)
    # Across chunks, recurrently: the state entering chunk c.
    perm = [1, 0] + list(range(2, len(b_c.shape) - 1))
    a_last = ops.transpose(a_prefix[:, :, -1], perm)  # [C, B, ...]
    z_last = ops.transpose(z_local[:, :, -1], perm)
    if initial_state is None:
        init = ops.zeros_like(z_last[0])
    else:
        init = initial_state + ops.zeros_like(z_last[0])

    def step(state, inputs):
        a_step, b_step = inputs
        return a_step * state + b_step, state  # emit the state *entering* the chunk

    _, entering = time_loop(step, init, (a_last, z_last))
    entering = ops.expand_dims(ops.transpose(entering, perm), 2)  # [B, C, 1, ...]
    z = z_local + a_prefix * entering
    z = ops.reshape(z, [-1, num_chunks * chunk_size] + tail)
    return z[:, :length] if pad else z


def prefix_scan(a, b):
    """Inclusive prefixes of `(a_t, b_t)` under `(a₁, b₁) ∘ (a₂, b₂) = (a₁·a₂, a₂·b₁ + b₂)`
    along axis 1: `(a_1 ⋯ a_t, z_t)` with `z_t = a_t z_{t−1} + b_t`, `z_0 = 0`.

    The building block of a chunk: with `h` the state entering it, the states inside are
    `z_t + (a_1 ⋯ a_t) ⊙ h`. `a` and `b` must have the same shape and a static length; no
    dtype change (callers accumulate in float32).

    Example:
    >>> products, states = prefix_scan(ops.full((1, 3, 1), 0.5), ops.ones((1, 3, 1)))
    """
    return _prefix_scan(a, b)


def scan_chunks(step, initial_state, sequences, chunk_size):
    """Run `step(state, chunk) -> (state, output)` over consecutive chunks of `chunk_size`
    steps, in order, carrying the state: the chunk-by-chunk loop of a chunked recurrence
    (§5.5), which keeps only one chunk's intermediates live at a time.

    Args:
        step: `step(state, chunk)`, with `chunk` a tuple of `[B, chunk_size, ...]` slices of
            `sequences`; returns the next state and an output shaped like the chunk of the
            first sequence.
        initial_state: the state entering the first chunk.
        sequences: tuple of `[B, T, ...]` tensors with the same static `T`; the last chunk
            is padded with zeros (the step must leave the state unchanged there, e.g. through
            a validity mask passed as one of the sequences).
        chunk_size: positive int.

    Returns:
        `(final state, outputs [B, T, ...])`.

    Example:
    >>> def step(total, chunk):
    ...     (x,) = chunk
    ...     running = total[:, None] + ops.cumsum(x, axis=1)
    ...     return running[:, -1], running
    >>> total, cumulative = scan_chunks(step, ops.zeros((1,)), (ops.ones((1, 5)),), 2)
    """
    _check_chunk_size(chunk_size)
    length, num_chunks, pad = _chunk_layout(sequences[0], chunk_size, "scan_chunks")
    chunked = []
    for x in sequences:
        tail = list(x.shape[2:])
        if pad:
            x = ops.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * len(tail))
        x = ops.reshape(x, [-1, num_chunks, chunk_size] + tail)
        chunked.append(ops.transpose(x, [1, 0] + list(range(2, len(tail) + 3))))
    state, outputs = time_loop(step, initial_state, tuple(chunked), output_index=0)
    tail = list(outputs.shape[3:])
    outputs = ops.transpose(outputs, [1, 0] + list(range(2, len(tail) + 3)))
    outputs = ops.reshape(outputs, [-1, num_chunks * chunk_size] + tail)
    return state, (outputs[:, :length] if pad else outputs)


def sequential_scan(a, b, initial_state=None):
    """`z_t = a_t ⊙ z_{t−1} + b_t` by a compiled loop over time.

    Args:
        a: decays `[B, T, ...]` (broadcasts against `b`).
        b: inputs `[B, T, ...]`.
        initial_state: optional `z_0`, `[B, ...]` (broadcasts against `b[:, 0]`); zeros if None.

    Returns:
        The states `z_1 … z_T`, `[B, T, ...]`, in the dtype of `b`.

    Example:
    >>> sequential_scan(ops.full((1, 3, 1), 0.5), ops.ones((1, 3, 1)))  # 1, 1.5, 1.75
    """
    a, b, initial_state, out_dtype = _prepare(a, b, initial_state)
    return ops.cast(_sequential(a, b, initial_state), out_dtype)


def associative_scan(a, b, initial_state=None):
    """`z_t = a_t ⊙ z_{t−1} + b_t` by a parallel prefix scan of depth `O(log T)`.

    The pairs `(a_t, b_t)` are combined by `(a₁, b₁) ∘ (a₂, b₂) = (a₁·a₂, a₂·b₁ + b₂)`, which
    is associative; the prefix `(a₁, b₁) ∘ … ∘ (a_t, b_t)` holds `z_t` in its second part. An
    initial state enters as `b₁ ← a₁ z₀ + b₁`.

    Args and returns: as `sequential_scan`.

    Example:
    >>> associative_scan(ops.full((1, 3, 1), 0.5), ops.ones((1, 3, 1)))  # 1, 1.5, 1.75
    """
    a, b, initial_state, out_dtype = _prepare(a, b, initial_state)
    return ops.cast(_associative(a, b, initial_state), out_dtype)


def chunked_scan(a, b, initial_state=None, chunk_size=64):
    """`z_t = a_t ⊙ z_{t−1} + b_t`, parallel inside chunks and recurrent across chunks.

    The sequence is cut into `⌈T / chunk_size⌉` chunks (padded with identity steps). Inside a
    chunk, an associative scan gives the prefix products `P_t = a_{s+1} ⋯ a_t` and the states
    `ẑ_t` started from zero; a sequential scan over the chunks carries the boundary state `h`,
    and `z_t = ẑ_t + P_t ⊙ h`.

    Args:
        a, b, initial_state: as `sequential_scan`; the sequence length must be static.
        chunk_size: positive int, steps per chunk.

    Returns: as `sequential_scan`.

    Example:
    >>> chunked_scan(ops.full((1, 5, 1), 0.5), ops.ones((1, 5, 1)), chunk_size=2)
    """
    _check_chunk_size(chunk_size)
    a, b, initial_state, out_dtype = _prepare(a, b, initial_state)
    return ops.cast(_chunked(a, b, initial_state, chunk_size), out_dtype)


def _check_chunk_size(chunk_size):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int. Received: chunk_size={chunk_size}")


def linear_recurrence(a, b, initial_state=None, method="associative", chunk_size=64):
    """The first-order linear recurrence `z_t = a_t ⊙ z_{t−1} + b_t` over axis 1 (§5.5).

    Args:
        a: decays `[B, T, ...]`, broadcastable against `b` (same rank).
        b: inputs `[B, T, ...]`.
        initial_state: optional `z_0`, `[B, ...]`; zeros if None.
        method: `"associative"` (parallel prefix scan), `"sequential"` (compiled loop) or
            `"chunked"` (parallel inside chunks of `chunk_size`, recurrent across them). The
            associative and chunked scans need a static sequence length.
        chunk_size: positive int, used by `"chunked"`.

    Returns:
        `[B, T, ...]` states `z_1 … z_T` in the dtype of `b`; accumulated in float32 when `b` is
        float16 or bfloat16.

    Example:
    >>> a = ops.full((2, 8, 4), 0.9)
    >>> b = ops.ones((2, 8, 4))
    >>> z = linear_recurrence(a, b, method="chunked", chunk_size=4)  # z_t = Σ 0.9^k
    """
    if method == "associative":
        return associative_scan(a, b, initial_state)
    if method == "sequential":
        return sequential_scan(a, b, initial_state)
    if method == "chunked":
        return chunked_scan(a, b, initial_state, chunk_size=chunk_size)
    raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
