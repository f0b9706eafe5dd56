"""Linear attention: `Q′(K′ᵀV)` and its causal running sums, chunk-parallel (survey §5.3.2,
§5.5.2). Pure functions of feature-mapped queries and keys; the layer is
`keras_xf.layers.LinearAttention`."""

from keras import ops

from keras_xf.ops.scan import linear_recurrence


def linear_attention(qf, kf, values):
    """Non-causal `Q′(K′ᵀV)`: each query reads the sums `μ_n = Σ_j k′_jᵀ v_j` (§5.3.2).

    Args:
        qf: `φ(Q)`, `[B, T, H, m]`.
        kf: `φ(K)`, `[B, S, H, m]` (zero rows for padded keys).
        values: `[B, S, H, e]`; a column of ones appended gives `ν_n` too.

    Returns:
        `q′_i μ_n`, `[B, T, H, e]`, in the dtype of the inputs.
    """
    summary = ops.einsum("bthm,bthe->bhme", kf, values)  # [μ_n | ν_n]
    return ops.einsum("bthm,bhme->bthe", qf, summary)


def causal_linear_attention(qf, kf, values, log_decay=None, scale=None, state=None,
                            chunk_size=64):
    """Causal `q′_j μ_j` with `μ_j = a_j μ_{j−1} + s_j k′_jᵀ v_j` (§5.5.2), chunk-parallel.

    Inside a chunk of `chunk_size` positions a masked quadratic form
    `Σ_{i≥j} (q′_i·k′_j) s_j exp(L_i − L_j) v_j` (`L` the running sum of `log a` in the
    chunk); across chunks the state carried by `keras_xf.ops.scan.linear_recurrence` (a
    running sum without decay; a masked sum over chunk pairs when the length is unknown).

    Args:
        qf: `φ(Q)`, `[B, T, H, m]`.
        kf: `φ(K)`, `[B, T, H, m]` (zero rows for padded keys).
        values: `[B, T, H, e]`.
        log_decay: optional `log a_j`, `[B, T, H]` (`None`: `a = 1`).
        scale: optional input factor `s_j` (`1 − a_j` in the decayed form), `[B, T, H]`.
        state: optional `μ_0`, `[B, H, m, e]`.
        chunk_size: positive int.

    Returns:
        `(outputs [B, T, H, e], μ_T [B, H, m, e])`.
    """
    batch, length = ops.shape(qf)[0], qf.shape[1]
    if length is None:  # a dynamic length (relaxed TensorFlow traces): pad to chunks
        chunk = chunk_size
        valid = ops.shape(qf)[1]
        pad = (chunk - valid % chunk) % chunk
    else:
        chunk = min(chunk_size, length)
        valid, pad = length, -length % chunk
    if scale is not None:
        kf = kf * scale[..., None]

    def padded(t):
        if length is not None and not pad:
            return t
        zeros = ops.zeros((batch, pad) + tuple(t.shape[2:]), t.dtype)
        return ops.concatenate([t, zeros], axis=1)

    qf, kf, values = padded(qf), padded(kf), padded(values)
    if log_decay is not None:
        log_decay = padded(log_decay)

    # A static chunk count where the length is static (with -1, TensorFlow loses it when the
    # batch size is unknown, and the scan across chunks needs it).
    chunks = -1 if length is None else (length + pad) // chunk

    def chunked(t):
        return ops.reshape(t, (batch, chunks, chunk) + tuple(t.shape[2:]))

    qf, kf, values = chunked(qf), chunked(kf), chunked(values)
    positions = ops.arange(chunk)
    causal = ops.greater_equal(positions[:, None], positions[None, :])
    scores = ops.einsum("bnihm,bnjhm->bnhij", qf, kf)
    if log_decay is None:
        scores = ops.where(causal, scores, 0.0)
        inner = ops.einsum("bnhij,bnjhe->bnihe", scores, values)
        summaries = ops.einsum("bnjhm,bnjhe->bnhme", kf, values)
        ends = ops.cumsum(summaries, axis=1)
        if state is not None:
            ends = ends + state[:, None]
        first = ops.zeros_like(ends[:, :1]) if state is None else state[:, None]
        starts = ops.concatenate([first, ends[:, :-1]], axis=1)
        outer = ops.einsum("bnihm,bnhme->bnihe", qf, starts)
        return _merge_chunks(inner + outer, valid), ends[:, -1]

    # L_i = Σ_{t ≤ i} log a_t inside each chunk; a_{j+1} ⋯ a_i = exp(L_i − L_j).
    cumulative = ops.cumsum(chunked(log_decay), axis=2)  # [B, N, c, H]
    levels = ops.transpose(cumulative, (0, 1, 3, 2))  # [B, N, H, c]
    gaps = levels[..., :, None] - levels[..., None, :]
    decays = ops.where(causal, ops.exp(ops.where(causal, gaps, 0.0)), 0.0)
    inner = ops.einsum("bnhij,bnjhe->bnihe", scores * decays, values)
    last = cumulative[:, :, -1]  # [B, N, H]
    to_end = ops.exp(last[:, :, None] - cumulative)  # [B, N, c, H]
    summaries = ops.einsum("bnjhm,bnjhe->bnhme", kf * to_end[..., None], values)
    if length is None:
        ends = _states_of_dynamic_chunks(last, summaries, state)
    else:
        chunk_decay = ops.exp(last)[..., None, None]
        ends = linear_recurrence(chunk_decay, summaries, initial_state=state)
    first = ops.zeros_like(ends[:, :1]) if state is None else state[:, None]
    starts = ops.concatenate([first, ends[:, :-1]], axis=1)
    outer = ops.einsum("bnihm,bnhme->bnihe", qf * ops.exp(cumulative)[..., None], starts)
    return _merge_chunks(inner + outer, valid), ends[:, -1]


def _states_of_dynamic_chunks(last, summaries, state):
    """The states at the chunk ends when the number of chunks is not static (a relaxed
    TensorFlow trace, where no scan compiles): `S_n = Σ_{k≤n} exp(G_n − G_k) U_k +
    exp(G_n) S_0` with `G_n` the summed log decays of chunks `1 … n`, as one masked sum."""
    totals = ops.cumsum(last, axis=1)  # [B, N, H]
    gaps = totals[:, :, None] - totals[:, None, :]  # [B, N, N, H]
    chunks = ops.arange(ops.shape(totals)[1])
    earlier = ops.greater_equal(chunks[:, None], chunks[None, :])[None, :, :, None]
    weights = ops.where(earlier, ops.exp(ops.where(earlier, gaps, 0.0)), 0.0)
    ends = ops.einsum("bnkh,bkhme->bnhme", weights, summaries)
    if state is not None:
        ends = ends + ops.exp(totals)[..., None, None] * state[:, None]
    return ends


def _merge_chunks(outputs, length):
    """`[B, N, c, H, e]` back to `[B, T, H, e]`, without the padding."""
    shape = ops.shape(outputs)
    merged = ops.reshape(outputs, (shape[0], -1) + tuple(outputs.shape[3:]))
    return merged[:, :length]
