"""Numpy oracle for survey §5.1: the attention fields π_i of local, chunked and strided
attention as dense masks, and sparse attention `A'(i, j) = a_ij` for `j ∈ π_i`, 0 otherwise.

Each field is built from the survey's wording (spans, a segmentation into chunks, a window
slid by a stride), not from the closed forms the library uses.
"""

import numpy as np

from tests.reference.attention import softmax_with_mask


def local_field(length, window_left, window_right):
    """`π_i = [a_i^l, a_i^r] = [i − window_left, i + window_right]` as a `[n, n]` mask."""
    mask = np.zeros((length, length), bool)
    for i in range(length):
        mask[i, max(0, i - window_left) : min(length, i + window_right + 1)] = True
    return mask


def chunked_field(length, chunk_size):
    """Segmentation `chunk_k = [c_k^l, c_k^r]` into equal chunks; `π_i` = the chunk of `i`."""
    mask = np.zeros((length, length), bool)
    for start in range(0, length, chunk_size):
        mask[start : start + chunk_size, start : start + chunk_size] = True
    return mask


def strided_field(length, window, stride):
    """A context window of `window` positions slid by `stride` (starting at 0): each window
    `W_k = [k·stride, k·stride + window − 1]` is attended within, and `π_i` is the union of
    the windows holding `i`."""
    mask = np.zeros((length, length), bool)
    for start in range(0, length, stride):
        mask[start : start + window, start : start + window] = True
    return mask


def sparse_attention(q, k, v, field, padding_mask=None, causal=False, scale=None):
    """`A' V` with `A' = Softmax(Q Kᵀ/√d + M')`, `M'(i, j) = 0` for `j ∈ π_i` (and `j ≤ i`
    when causal), `−∞` otherwise (survey §5.1), in float64; rows with an empty field are 0.

    Args:
        q: `[B, T, H, Dh]`; k, v: `[B, T, Hkv, Dh]` (query head `h` uses kv head
            `h // (H / Hkv)`, survey §5.4).
        field: boolean `[T, T]`.
        padding_mask: optional boolean `[B, T]` over the keys.

    Returns:
        `[B, T, H, Dh]`.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    mask = np.asarray(field, bool)[None, None]
    if causal:
        length = q.shape[1]
        mask = mask & (np.arange(length)[:, None] >= np.arange(length)[None, :])
    if padding_mask is not None:
        mask = mask & np.asarray(padding_mask, bool)[:, None, None, :]
    weights = softmax_with_mask(scores, mask)
    return np.einsum("bhts,bshd->bthd", weights, v)
