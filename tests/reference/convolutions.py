"""Numpy oracle for the convolutional sequence mixers (survey §5.5.1): the equations written
with explicit loops over positions, taps and channels, in float64."""

import numpy as np


def window_start(kernel_size, causal):
    """`l`: the output at `t` reads `x_{t−l} … x_{t−l+K−1}`."""
    return kernel_size - 1 if causal else (kernel_size - 1) // 2


def _tap(x, b, s, c, history):
    """`x_{s,c}` of sequence `b`, zero outside `[0, T)`; before `0`, the history (the last
    `K − 1` inputs of earlier tokens) when given."""
    if 0 <= s < x.shape[1]:
        return x[b, s, c]
    if s < 0 and history is not None:
        return history[b, history.shape[1] + s, c]
    return 0.0


def convolve(x, kernel_of, kernel_size, causal, history=None):
    """`y_{t,c} = Σ_j w(b, t, c)[j] · x_{t−l+j, c}` with `kernel_of(b, t, c)` giving the `K`
    taps of channel `c` at position `t`."""
    x = np.asarray(x, np.float64)
    batch, length, channels = x.shape
    start = window_start(kernel_size, causal)
    y = np.zeros_like(x)
    for b in range(batch):
        for t in range(length):
            for c in range(channels):
                taps = kernel_of(b, t, c)
                y[b, t, c] = sum(taps[j] * _tap(x, b, t - start + j, c, history)
                                 for j in range(kernel_size))
    return y


def softmax(w, axis=-1):
    w = np.asarray(w, np.float64)
    e = np.exp(w - w.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def glu(x):
    a, g = np.split(np.asarray(x, np.float64), 2, axis=-1)
    return a / (1.0 + np.exp(-g))


def dense(x, kernel, bias=None):
    out = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)
    return out if bias is None else out + bias


def depthwise(x, kernel, bias, causal, history=None):
    """`y_{t,c} = Σ_j W_{j,c} x_{t−l+j,c} + b_c`; kernel `[K, C]`."""
    kernel = np.asarray(kernel, np.float64)
    y = convolve(x, lambda b, t, c: kernel[:, c], kernel.shape[0], causal, history)
    return y if bias is None else y + bias


def lightweight(x, weights, causal, weight_softmax=True, history=None):
    """`y_{t,c} = Σ_j softmax(W_h)_j x_{t−l+j,c}` with `h = ⌊c·H/d⌋`; weights `[H, K]`."""
    heads, kernel_size = weights.shape
    normalized = softmax(weights) if weight_softmax else np.asarray(weights, np.float64)
    channels = x.shape[-1]
    return convolve(x, lambda b, t, c: normalized[c * heads // channels], kernel_size, causal,
                    history)


def dynamic(x, kernel, bias, heads, kernel_size, causal, weight_softmax=True, history=None):
    """`W̃_t = softmax_K(reshape_{H×K}(x_t W + b))`, `y_{t,c} = Σ_j W̃_{t,h,j} x_{t−l+j,c}`
    with `h = ⌊c·H/d⌋`."""
    x = np.asarray(x, np.float64)
    channels = x.shape[-1]

    def kernel_of(b, t, c):
        logits = dense(x[b, t], kernel, bias).reshape(heads, kernel_size)
        weights = softmax(logits) if weight_softmax else logits
        return weights[c * heads // channels]

    return convolve(x, kernel_of, kernel_size, causal, history)


def layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def batch_norm_inference(x, gamma, beta, moving_mean, moving_var, epsilon):
    return (x - moving_mean) / np.sqrt(moving_var + epsilon) * gamma + beta


def swish(x):
    return x / (1.0 + np.exp(-x))
