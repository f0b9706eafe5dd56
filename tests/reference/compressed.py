"""Numpy oracle for survey §5.3 (low-dimensional models): attention over `n′` compressed or
selected keys (§5.3.1) and the product-key memory (§5.3.2, Lample et al. 2019).

Written from the equations, in float64; the softmax and the masks come from `attention.py`.
"""

import numpy as np

from tests.reference.attention import softmax_with_mask


def _heads(x, w, b, group=1):
    """`x W + b` as `[B, H, S, Dh]`, key/value heads repeated `group` times."""
    out = np.einsum("bsd,dhk->bhsk", x, w)
    if b is not None:
        out = out + b[None, :, None, :]
    return np.repeat(out, group, axis=1)


def _merge(context, weights):
    out = np.einsum("bhtk,hkd->btd", context, weights["wo"])
    return out + weights["bo"] if weights.get("bo") is not None else out


def compressed_attention(
    query_input,
    kv_input,
    weights,
    num_heads,
    method,
    compression,
    padding_mask=None,
    num_key_value_heads=None,
    stride=None,
    compressed_length=None,
    causal=False,
):
    """`Att = A V′`, `A = Softmax(Q K′ᵀ/√d + M)` with `K′, V′` reduced from `K, V` (§5.3.1).

    Args:
        query_input: `[B, T, d]`; kv_input: `[B, S, d_kv]`.
        weights: `wq, wk, wv, wo` (and biases `bq, bk, bv, bo`) as in `attention.py`.
        method: `"projection"`: `K′ = Uᵏ K` with `compression = (Uᵏ, Uᵛ)`, `[n′, n]`, the first
            `S` columns used; `"convolution"`: `K′ = Conv(K, W_c, stride, stride)` over the
            length with `compression = (Wᵏ, bᵏ, Wᵛ, bᵛ)`, `W [stride, C, C]` on the channels
            `C = Hkv·Dh`; `"selection"`: each query keeps its `compressed_length` keys of
            highest score `q·kᵀ/√d` among those it may attend to (`compression` unused).
        padding_mask: boolean `[B, S]`; padding keys/values are zeroed before compression.

    Returns:
        (`[B, T, d_out]` outputs, `[B, H, T, n′]` weights).
    """
    batch, kv_length = kv_input.shape[:2]
    kv_heads = num_key_value_heads or num_heads
    group = num_heads // kv_heads
    q = _heads(query_input, weights["wq"], weights.get("bq"))
    k = _heads(kv_input, weights["wk"], weights.get("bk"))  # [B, Hkv, S, Dh]
    v = _heads(kv_input, weights["wv"], weights.get("bv"))
    valid = np.ones((batch, kv_length), bool) if padding_mask is None else padding_mask
    scale = 1.0 / np.sqrt(q.shape[-1])

    if method == "selection":
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("bhtk,bhsk->bhts", q, k) * scale
        allowed = np.broadcast_to(valid[:, None, None, :], scores.shape)
        if causal:
            allowed = allowed & (np.arange(q.shape[2])[:, None] >= np.arange(kv_length)[None, :])
        keep = np.zeros(scores.shape, bool)
        for index in np.ndindex(*scores.shape[:3]):
            candidates = np.flatnonzero(allowed[index])
            order = candidates[np.argsort(-scores[index][candidates], kind="stable")]
            keep[index][order[:compressed_length]] = True
        alpha = softmax_with_mask(scores, keep)
        return _merge(np.einsum("bhts,bhsk->bhtk", alpha, v), weights), alpha

    zero = valid[:, None, :, None]
    k, v = np.where(zero, k, 0.0), np.where(zero, v, 0.0)
    if method == "projection":
        uk, uv = (np.asarray(u, np.float64)[:, :kv_length] for u in compression)
        k_c = np.einsum("ms,bhsk->bhmk", uk, k)
        v_c = np.einsum("ms,bhsk->bhmk", uv, v)
        compressed_valid = np.repeat(valid.any(axis=1, keepdims=True), uk.shape[0], axis=1)
    else:
        wk, bk, wv, bv = compression
        compressed = -(-kv_length // stride)
        k_c, v_c = _convolve(k, wk, bk, stride), _convolve(v, wv, bv, stride)
        compressed_valid = np.zeros((batch, compressed), bool)
        for m in range(compressed):
            compressed_valid[:, m] = valid[:, m * stride : (m + 1) * stride].any(axis=1)
    k_c, v_c = np.repeat(k_c, group, axis=1), np.repeat(v_c, group, axis=1)
    scores = np.einsum("bhtk,bhmk->bhtm", q, k_c) * scale
    alpha = softmax_with_mask(scores, compressed_valid[:, None, None, :])
    return _merge(np.einsum("bhtm,bhmk->bhtk", alpha, v_c), weights), alpha


def _convolve(states, kernel, bias, stride):
    """`K′_m = Σ_{r<stride} K_{m·stride + r} W_r + b` over `[B, Hkv, S, Dh]`, channels merged;
    positions past the end count as zeros."""
    batch, heads, length, dim = states.shape
    flat = np.transpose(states, (0, 2, 1, 3)).reshape(batch, length, heads * dim)
    compressed = -(-length // stride)
    out = np.zeros((batch, compressed, heads * dim))
    for m in range(compressed):
        for r in range(stride):
            position = m * stride + r
            if position < length:
                out[:, m] += flat[:, position] @ np.asarray(kernel[r], np.float64)
    if bias is not None:
        out = out + bias
    return np.transpose(out.reshape(batch, compressed, heads, dim), (0, 2, 1, 3))


def product_key_memory(inputs, query_kernel, query_bias, sub_keys, values, top_k):
    """Product-key memory (§5.3.2): `m(x) = Σ_{i ∈ I} w_i v_i` per head, summed over heads.

    The query `q(x) = x W_q + b_q` of each head is split into halves `q₁, q₂`; a product key
    `(c_a, c′_b)` scores `q₁·c_a + q₂·c′_b`; `I` is the exact top-`k` of all `num_keys²`
    product keys (computed here by brute force: the library's candidate search over the
    `k × k` Cartesian product of the per-half top-`k` must find the same set), `w = Softmax`
    over their scores, and key `(a, b)` reads value row `a·num_keys + b`.

    Args:
        inputs: `[B, T, d]`; query_kernel: `[d, H·d_k]`; query_bias: `[H·d_k]` or None.
        sub_keys: `[H, 2, num_keys, d_k/2]`; values: `[num_keys², d_v]`.

    Returns:
        `[B, T, d_v]`.
    """
    heads, _, num_keys, half = sub_keys.shape
    queries = np.einsum("btd,dk->btk", inputs, query_kernel)
    if query_bias is not None:
        queries = queries + query_bias
    queries = queries.reshape(inputs.shape[:2] + (heads, 2, half))
    output = np.zeros(inputs.shape[:2] + (values.shape[-1],))
    for h in range(heads):
        first = np.einsum("btk,nk->btn", queries[:, :, h, 0], sub_keys[h, 0])
        second = np.einsum("btk,nk->btn", queries[:, :, h, 1], sub_keys[h, 1])
        scores = (first[..., :, None] + second[..., None, :]).reshape(inputs.shape[:2] + (-1,))
        best = np.argsort(-scores, axis=-1, kind="stable")[..., :top_k]
        chosen = np.take_along_axis(scores, best, axis=-1)
        weights = softmax_with_mask(chosen)
        output += np.einsum("btk,btkd->btd", weights, values[best])
    return output
