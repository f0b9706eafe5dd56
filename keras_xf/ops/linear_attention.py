"""Linear attention: the feature maps `φ`, `Q′(K′ᵀV)` and its causal running sums,
chunk-parallel, normalised by `q′ν` (survey §5.3.2, §5.5.2), and the causal convolution of the
keys. Pure functions; the layer is `keras_xf.layers.LinearAttention`."""

import math

import numpy as np
from keras import ops

from keras_xf.ops.convolution import pad_sequence
from keras_xf.ops.convolution import rolling_cache
from keras_xf.ops.scan import linear_recurrence

FEATURE_MAPS = ("elu", "relu", "taylor", "random_features", "identity")


def feature_size(feature_map, head_dim, num_features=None):
    """`m`, the width of `φ(x)` for heads of width `d_h`: `d_h`; `1 + d_h + d_h(d_h+1)/2` for
    `"taylor"`; `num_features` (default `2·d_h`) for `"random_features"`."""
    if feature_map == "random_features":
        return num_features or 2 * head_dim
    if feature_map == "taylor":
        return 1 + head_dim + head_dim * (head_dim + 1) // 2
    return head_dim


def feature_map_of(x, feature_map, projection=None, stabilize=False):
    """`φ(x)` in float32, `[B, T, H, m]`, for queries or keys `x` `[B, T, H, d_h]` (§5.3.2).

    `"elu"`: `elu(x) + 1`; `"relu"`; `"identity"`; `"taylor"`, the second-order Taylor
    expansion of `exp(q·k/√d_h)` (Based): `φ(x) = [1, x, x_i x_j c_ij (i ≤ j)]` of
    `x/d_h^{1/4}` with `c_ii = 1/√2`, `c_ij = 1`, so that `φ(q)·φ(k) = 1 + s + s²/2`,
    `s = q·k/√d_h`; `"random_features"`, Performer's positive random features (FAVOR+):
    `φ(x) = exp(ωᵀx − |x|²/2)/√m` of `x/d_h^{1/4}` with `ω = projection` `[d_h, m]`, so that
    `φ(q)·φ(k) ≈ exp(q·k/√d_h)`. `stabilize=True` (queries of a normalised attention) subtracts
    each row's largest exponent, a factor that cancels in `q′μ / q′ν` and keeps `exp` finite.
    """
    x = ops.cast(x, "float32")
    if feature_map == "elu":
        return ops.elu(x) + 1.0
    if feature_map == "relu":
        return ops.relu(x)
    if feature_map == "identity":
        return x
    head_dim = x.shape[-1]
    x = x * head_dim ** -0.25
    if feature_map == "taylor":
        # The products of the symmetric x xᵀ once each.
        rows, cols = np.triu_indices(head_dim)
        weights = ops.convert_to_tensor(np.where(rows == cols, math.sqrt(0.5), 1.0), "float32")
        rows, cols = (ops.convert_to_tensor(i, "int32") for i in (rows, cols))
        pairs = ops.take(x, rows, axis=-1) * ops.take(x, cols, axis=-1) * weights
        return ops.concatenate([ops.ones_like(x[..., :1]), x, pairs], axis=-1)
    exponent = ops.einsum("bthk,km->bthm", x, projection)
    exponent = exponent - 0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True)
    if stabilize:
        exponent = exponent - ops.stop_gradient(ops.max(exponent, axis=-1, keepdims=True))
    return ops.exp(exponent) / math.sqrt(projection.shape[-1])


def decay_logits(decays):
    """`θ = log(a / (1 − a))` of each decay `a` in (0, 1), so that `a = σ(θ)`: the logits a
    decay is learned or gated through (§5.5.2)."""
    return [math.log(a) - math.log1p(-a) for a in decays]


def causal_key_convolution(keys, kernel, window=None):
    """`k̃_t = Σ_{o<K} w_o ⊙ k_{t−o}` (a causal depthwise convolution of the keys, §5.5.1) over
    `[window | keys]`, zeros before the first position as the convolutional mixers pad.

    Args:
        keys: `[B, T, H, d_h]`.
        kernel: `w`, `[K, H, d_h]`.
        window: optional `[B, K − 1, H, d_h]`, the keys before these (a decoding cache).

    Returns:
        `(k̃ [B, T, H, d_h], the last K − 1 keys [B, K − 1, H, d_h] in float32)`.
    """
    size, heads, dim = kernel.shape
    batch = ops.shape(keys)[0]
    history = None if window is None else ops.reshape(window, (batch, size - 1, heads * dim))
    padded = pad_sequence(ops.reshape(keys, (batch, -1, heads * dim)), size, True, history)
    last = ops.reshape(rolling_cache(padded, size), (batch, size - 1, heads, dim))
    padded = ops.reshape(padded, (batch, -1, heads, dim))
    kernel = ops.cast(kernel, keys.dtype)
    # Offset o reads padded[K−1−o : len − o], the keys o positions back.
    mixed = 0.0
    for o in range(size):
        mixed = mixed + kernel[o] * padded[:, size - 1 - o:None if o == 0 else -o]
    return mixed, last


def normalized_linear_attention(qf, kf, values, causal, log_decay=None, scale=None, state=None,
                                normalize=True, epsilon=1e-6, chunk_size=64):
    """`c_i = q′_i μ / max(q′_i ν, ε)` (or `q′_i μ` when not `normalize`), with the sums over all
    keys (non-causal, `linear_attention`) or the running, optionally decayed sums of the causal
    form (`causal_linear_attention`), in float32 (§5.3.2, §5.5.2).

    Args:
        qf, kf: `φ(Q)`, `φ(K)`, `[B, T, H, m]` (zero rows for padded keys).
        values: `[B, T, H, e]`.
        causal: bool.
        log_decay, scale: as `causal_linear_attention` (causal only).
        state: optional `(μ [B, H, m, e], ν [B, H, m])` the causal sums continue from.
        normalize, epsilon: the division by `max(q′ν, ε)`.
        chunk_size: positive int.

    Returns:
        `(outputs [B, T, H, e], (μ, ν) after the last position)`; the sums are `None` for
        the non-causal form.
    """
    # [v | 1]: one product gives the numerator q′μ and the denominator q′ν together.
    values = ops.cast(values, "float32")
    values = ops.concatenate([values, ops.ones_like(values[..., :1])], axis=-1)
    sums = None
    if causal:
        if state is not None:
            mu, nu = state
            state = ops.concatenate(
                [ops.cast(mu, "float32"), ops.cast(nu, "float32")[..., None]], axis=-1
            )
        mixed, last = causal_linear_attention(
            qf, kf, values, log_decay, scale, state, chunk_size=chunk_size
        )
        sums = (last[..., :-1], last[..., -1])
    else:
        mixed = linear_attention(qf, kf, values)
    numerator, denominator = mixed[..., :-1], mixed[..., -1:]
    if normalize:
        return numerator / ops.maximum(denominator, epsilon), sums
    return numerator, sums


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
