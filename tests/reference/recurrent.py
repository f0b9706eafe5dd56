"""Numpy recurrent and averaging mixers (survey §5.5.2, §5.2.2), written as naive loops.

Shapes: inputs `x [B, T, d]`, boolean `mask [B, T]` (a padded step leaves the state
unchanged), states `[B, units]`. Weights follow the Keras layouts: an LSTM kernel
`[d, 4u]` with gates in the order `i, f, c, o`; a GRU (`reset_after=True`) kernel `[d, 3u]`
and bias `[2, 3u]` (input bias, recurrent bias) with gates in the order `z, r, h`.
"""

import numpy as np


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _f64(x):
    return np.asarray(x, np.float64)


def _steps(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


def lstm(x, kernel, recurrent_kernel, bias, mask=None, state=None, reverse=False):
    """`[i, f, c̃, o] = [σ, σ, tanh, σ](x W + h U + b)`, `c = f c + i c̃`, `h = o tanh(c)`.

    Returns `(outputs [B, T, u], (h, c))`; a padded step keeps `(h, c)` and outputs zeros.
    """
    x, kernel, recurrent_kernel = _f64(x), _f64(kernel), _f64(recurrent_kernel)
    batch, length, _ = x.shape
    units = recurrent_kernel.shape[0]
    bias = np.zeros(4 * units) if bias is None else _f64(bias)
    mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    h, c = (np.zeros((batch, units)), np.zeros((batch, units))) if state is None else map(
        _f64, state)
    outputs = np.zeros((batch, length, units))
    for t in _steps(length, reverse):
        z = x[:, t] @ kernel + h @ recurrent_kernel + bias
        i, f, g, o = np.split(z, 4, axis=-1)
        new_c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        new_h = _sigmoid(o) * np.tanh(new_c)
        valid = mask[:, t, None]
        h, c = np.where(valid, new_h, h), np.where(valid, new_c, c)
        outputs[:, t] = np.where(valid, new_h, 0.0)
    return outputs, (h, c)


def gru(x, kernel, recurrent_kernel, bias, mask=None, state=None, reverse=False):
    """Keras' GRU with `reset_after=True`:
    `z, r = σ(x W_{z,r} + b_{z,r} + h U_{z,r} + b'_{z,r})`,
    `h̃ = tanh(x W_h + b_h + r ⊙ (h U_h + b'_h))`, `h = z h + (1 − z) h̃`.

    Returns `(outputs [B, T, u], (h,))`.
    """
    x, kernel, recurrent_kernel = _f64(x), _f64(kernel), _f64(recurrent_kernel)
    batch, length, _ = x.shape
    units = recurrent_kernel.shape[0]
    bias = np.zeros((2, 3 * units)) if bias is None else _f64(bias)
    mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    h = np.zeros((batch, units)) if state is None else _f64(state[0])
    outputs = np.zeros((batch, length, units))
    for t in _steps(length, reverse):
        xz, xr, xh = np.split(x[:, t] @ kernel + bias[0], 3, axis=-1)
        hz, hr, hh = np.split(h @ recurrent_kernel + bias[1], 3, axis=-1)
        z = _sigmoid(xz + hz)
        r = _sigmoid(xr + hr)
        candidate = np.tanh(xh + r * hh)
        new_h = z * h + (1.0 - z) * candidate
        valid = mask[:, t, None]
        h = np.where(valid, new_h, h)
        outputs[:, t] = np.where(valid, new_h, 0.0)
    return outputs, (h,)


def average_attention(x, ffn=None, gate=None, causal=True, mask=None, state=None):
    """The average attention network, one position at a time:
    `y_k = FFN(x_k)`, `g_j = Σ_{k≤j valid} y_k / #{k≤j valid}` (all valid `k` when not causal),
    `i, f = σ([x_j; g_j] W + b)`, `o_j = i ⊙ x_j + f ⊙ g_j`; padded positions output zeros.

    `ffn` is `(W_1, b_1, W_2, b_2)` with a ReLU between, or None (`y = x`); `gate` is
    `(W, b)` or None (`o = g`); `state` is `(sum [B, d], count [B])`.
    Returns `(outputs, (sum, count))`, the state after the last position (causal form).
    """
    x = _f64(x)
    batch, length, width = x.shape
    mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    y = x
    if ffn is not None:
        w1, b1, w2, b2 = map(_f64, ffn)
        y = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    total = np.zeros((batch, width)) if state is None else _f64(state[0]).copy()
    count = np.zeros(batch) if state is None else _f64(state[1]).copy()
    averages = np.zeros_like(x)
    if causal:
        for j in range(length):
            for b in range(batch):
                if mask[b, j]:
                    total[b] += y[b, j]
                    count[b] += 1
                averages[b, j] = total[b] / max(count[b], 1.0)
    else:
        for b in range(batch):
            valid = [k for k in range(length) if mask[b, k]]
            mean = sum((y[b, k] for k in valid), np.zeros(width)) / max(len(valid), 1)
            averages[b, :] = mean
    outputs = averages
    if gate is not None:
        w, bias = map(_f64, gate)
        gates = _sigmoid(np.concatenate([x, averages], axis=-1) @ w + bias)
        outputs = gates[..., :width] * x + gates[..., width:] * averages
    return np.where(mask[..., None], outputs, 0.0), (total, count)
