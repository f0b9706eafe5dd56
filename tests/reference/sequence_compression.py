"""Numpy oracle for survey §5.8 (sequence compression): strided-convolution downsampling with
padding masks, upsampling, and top-k token pruning.

Written from the equations with explicit loops, in float64.
"""

import math

import numpy as np


def downsample(x, kernel, bias, stride, padding_mask=None, shift=0):
    """`h′_i = b + Σ_{j<k} h_{i·s+j−shift} W_j` for `i < ⌈n/s⌉`, positions outside `[0, n)`
    and padded positions read as zero; compressed position `i` is real when any position its
    window reads is real, and its output is zero otherwise. `shift = k − 1` is the causal
    form (window `i` ends at position `i·s`).

    Returns (`[B, ⌈n/s⌉, d]`, boolean `[B, ⌈n/s⌉]`)."""
    batch, length, width = x.shape
    valid = np.ones((batch, length), bool) if padding_mask is None else np.asarray(padding_mask)
    size = kernel.shape[0]
    windows = math.ceil(length / stride)
    out = np.zeros((batch, windows, kernel.shape[-1]))
    mask = np.zeros((batch, windows), bool)
    for b in range(batch):
        for i in range(windows):
            total = np.zeros(kernel.shape[-1]) if bias is None else np.array(bias, np.float64)
            for j in range(size):
                position = i * stride + j - shift
                if 0 <= position < length and valid[b, position]:
                    total = total + x[b, position] @ kernel[j]
                    mask[b, i] = True
            out[b, i] = total if mask[b, i] else 0.0
    return out, mask


def upsample(x, stride, length, kernel=None, bias=None, residual=None, padding_mask=None):
    """`h_{i·s+j} = h′_i` (no kernel) or `h′_i U_j + c` (transposed convolution), cut to
    `length`, plus `residual`; padded positions zero. Returns `[B, length, d]`."""
    batch, _, width = x.shape
    out = np.zeros((batch, length, width if kernel is None else kernel.shape[-1]))
    for b in range(batch):
        for t in range(length):
            i, j = divmod(t, stride)
            value = x[b, i] if kernel is None else x[b, i] @ kernel[j]
            if kernel is not None and bias is not None:
                value = value + bias
            out[b, t] = value
    if residual is not None:
        out = out + residual
    if padding_mask is not None:
        out = np.where(np.asarray(padding_mask)[:, :, None], out, 0.0)
    return out


def token_pruning(x, scores, keep_ratio, padding_mask=None, gate="multiply"):
    """Keep the `k = ⌈ρ·n⌉` real tokens of highest score (padded tokens only when fewer
    than `k` are real, after every real one), in their original order.

    Gates: `"multiply"`: `h_i σ(s_i)`; `"straight_through"`: `h_i`. Positions kept that are
    padding give zero outputs.

    Returns (`[B, k, d]`, boolean `[B, k]`, int `[B, k]` indices)."""
    batch, length, _ = x.shape
    valid = np.ones((batch, length), bool) if padding_mask is None else np.asarray(padding_mask)
    keep = max(1, math.ceil(round(keep_ratio * length, 9)))
    outputs, masks, indices = [], [], []
    for b in range(batch):
        real = [i for i in range(length) if valid[b, i]]
        pads = [i for i in range(length) if not valid[b, i]]
        ranked = sorted(real, key=lambda i: -scores[b, i]) + pads
        chosen = sorted(ranked[:keep])
        gates = 1.0 / (1.0 + np.exp(-scores[b, chosen])) if gate == "multiply" else 1.0
        rows = x[b, chosen] * np.reshape(gates, (-1, 1))
        kept = valid[b, chosen]
        outputs.append(np.where(kept[:, None], rows, 0.0))
        masks.append(kept)
        indices.append(chosen)
    return np.stack(outputs), np.stack(masks), np.array(indices)
