"""Numpy oracle for survey §2.3 and §2.6: softmax with the mask M, QKV and multi-head attention.

Written from the equations, in float64, with `-inf` masking exactly as the survey writes it.
"""

import numpy as np


def softmax_with_mask(scores, mask=None):
    """`Softmax(scores + M)` with `M = 0` where `mask` is True and `-inf` elsewhere (§2.6).

    Rows that are entirely masked are defined as zeros (the library's convention).
    """
    scores = np.asarray(scores, dtype=np.float64)
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, bool), scores.shape)
        scores = np.where(mask, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    exp = np.exp(scores - top)
    total = np.sum(exp, axis=-1, keepdims=True)
    return np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)


def causal_mask(query_length, key_length=None, offset=0):
    """`M(i, j) = 0 if i + offset >= j else -inf`, as a boolean keep-mask (§2.6)."""
    key_length = query_length if key_length is None else key_length
    i = np.arange(query_length)[:, None] + offset
    j = np.arange(key_length)[None, :]
    return i >= j


def qkv_attention(q, k, v, mask=None, bias=None, scale=None):
    """`Att_qkv(Q, K, V) = Softmax(Q Kᵀ / √d + bias + M) V` for `[..., T, d]` arrays (§2.3)."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("...td,...sd->...ts", q, k) * scale
    if bias is not None:
        scores = scores + bias
    weights = softmax_with_mask(scores, mask)
    return np.einsum("...ts,...sd->...td", weights, v), weights


def multi_head_attention(
    query_input,
    kv_input,
    weights,
    num_heads,
    num_key_value_heads=None,
    mask=None,
    bias=None,
    scale=None,
):
    """`C = Merge(C_1 … C_τ) W_c` with `C_h = Att_qkv(H W_h^q, H W_h^k, H W_h^v)` (§2.3).

    Args:
        query_input: `[B, T, d]`; kv_input: `[B, S, d_kv]`.
        weights: dict with `wq [d, H, Dh]`, `wk [d_kv, Hkv, Dh]`, `wv [d_kv, Hkv, Dh]`,
            `wo [H, Dh, d_out]` and optional biases `bq [H, Dh]`, `bk`, `bv`, `bo [d_out]`.
        num_key_value_heads: key/value heads; query head `h` uses kv head `h // (H / Hkv)`
            (grouped-query attention, §5.4).
        mask: boolean, broadcastable to `[B, H, T, S]`.
        bias: additive, broadcastable to `[B, H, T, S]`.

    Returns:
        (`[B, T, d_out]` outputs, `[B, H, T, S]` weights).
    """
    num_key_value_heads = num_key_value_heads or num_heads
    group = num_heads // num_key_value_heads
    q = np.einsum("btd,dhk->bhtk", query_input, weights["wq"]) + _head_bias(weights, "bq")
    k = np.einsum("bsd,dhk->bhsk", kv_input, weights["wk"]) + _head_bias(weights, "bk")
    v = np.einsum("bsd,dhk->bhsk", kv_input, weights["wv"]) + _head_bias(weights, "bv")
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    context, alpha = qkv_attention(q, k, v, mask=mask, bias=bias, scale=scale)
    outputs = np.einsum("bhtk,hkd->btd", context, weights["wo"])
    if weights.get("bo") is not None:
        outputs = outputs + weights["bo"]
    return outputs, alpha


def _head_bias(weights, name):
    b = weights.get(name)
    return 0.0 if b is None else b[None, :, None, :]
