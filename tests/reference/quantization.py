"""Numpy per-channel abs-max quantisation (survey §5.9) and the quantised grouped projection.

`q = clip(round(w · s), lo, hi)` with `s = hi / (max |w| + ε)` along the reduced axis (one
scale per remaining index); `w ≈ q / s`. int8 uses `[-127, 127]`, int4 `[-8, 7]`; `ε` is
Keras' `backend.epsilon()` (1e-7), as in its `abs_max_quantize`.
"""

import numpy as np

EPSILON = 1e-7
RANGES = {"int8": (-127, 127), "int4": (-8, 7)}


def abs_max_quantize(w, axis, mode="int8"):
    """`(q, s)`: the integer values (float64 holding integers) and the scales, `s` keeping
    the reduced axis (size 1)."""
    lo, hi = RANGES[mode]
    w = np.asarray(w, np.float64)
    s = hi / (np.max(np.abs(w), axis=axis, keepdims=True) + EPSILON)
    return np.clip(np.round(w * s), lo, hi), s


def grouped_linear(x, kernel, bias=None, expert_index=None):
    """`y_g = x_g W^{e(g)} + b^{e(g)}` for `x [G, R, D]`, `kernel [E, D, F]`, `bias [E, F]`."""
    index = np.arange(len(x)) if expert_index is None else np.asarray(expert_index)
    y = np.einsum("grd,gdf->grf", np.asarray(x, np.float64), np.asarray(kernel, np.float64)[index])
    if bias is not None:
        y = y + np.asarray(bias, np.float64)[index][:, None, :]
    return y


def quantized_grouped_linear(x, kernel, bias=None, expert_index=None, mode="int8"):
    """The same with the kernel quantised per expert and output column; `int8` also rounds
    each input row to int8 (`y = (q_x · q) / (t · s)`), `int4` is weight-only
    (`y = (x · q) / s`)."""
    q, s = abs_max_quantize(kernel, axis=1, mode=mode)  # s [E, 1, F]
    index = np.arange(len(x)) if expert_index is None else np.asarray(expert_index)
    x = np.asarray(x, np.float64)
    scale = s[index]  # [G, 1, F]
    if mode == "int8":
        x, t = abs_max_quantize(x, axis=-1)  # t [G, R, 1]
        scale = scale * t
    y = np.einsum("grd,gdf->grf", x, q[index]) / scale
    if bias is not None:
        y = y + np.asarray(bias, np.float64)[index][:, None, :]
    return y
