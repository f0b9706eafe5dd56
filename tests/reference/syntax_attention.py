"""Numpy oracle for syntax-aware and multi-branch attention (survey §3.2, §3.3), low-dimensional
queries and keys (§5.3.2) and attention-map sharing across layers (§5.4).

Written from the equations in float64, with `-inf` masking as the survey writes it.
"""

import numpy as np

from tests.reference.attention import softmax_with_mask


def _head_bias(weights, name):
    b = weights.get(name)
    return 0.0 if b is None else b[None, :, None, :]


def _per_head(matrix, num_heads, guided_heads, neutral):
    """`M` `[B, T, S]` or `[B, H, T, S]` as `[B, H, T, S]`, `neutral` on unguided heads."""
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim == 3:
        matrix = np.repeat(matrix[:, None], num_heads, axis=1)
    if guided_heads is not None:
        keep = np.zeros(num_heads, bool)
        keep[list(guided_heads)] = True
        matrix = np.where(keep[None, :, None, None], matrix, neutral)
    return matrix


def syntax_attention(
    query_input,
    kv_input,
    weights,
    num_heads,
    num_key_value_heads=None,
    mask=None,
    additive=None,
    multiplicative=None,
    guided_heads=None,
    scale=None,
    given_weights=None,
):
    """Multi-head `C_h = Softmax(Q_h K_hᵀ/√d′ + M) V_h` or `Softmax(Q_h K_hᵀ/√d′ ⊙ M) V_h`.

    `AttSyn_self` of survey §3.2, per head (§2.3), with `M` on the `guided_heads` only
    (§3.3: syntax guides some heads). Query/key heads may be narrower than value heads
    (`wq [d, H, d′]`, `wk [d, Hkv, d′]`, `wv [d, Hkv, Dh]`, §5.3.2); the scale defaults to
    `1/√d′`. With `given_weights` `[B, H, T, S]` the scores are not computed: `C_h = α_h V_h`
    with `α` masked by `mask` (attention-map sharing, §5.4).

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
    if given_weights is None:
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        scores = np.einsum("bhtk,bhsk->bhts", q, k) * scale
        if additive is not None:
            scores = scores + _per_head(additive, num_heads, guided_heads, 0.0)
        if multiplicative is not None:
            scores = scores * _per_head(multiplicative, num_heads, guided_heads, 1.0)
        alpha = softmax_with_mask(scores, mask)
    else:
        alpha = np.asarray(given_weights, np.float64)
        if mask is not None:
            alpha = np.where(np.broadcast_to(mask, alpha.shape), alpha, 0.0)
    context = np.einsum("bhts,bhsk->bhtk", alpha, v)
    outputs = np.einsum("bhtk,hkd->btd", context, weights["wo"])
    if weights.get("bo") is not None:
        outputs = outputs + weights["bo"]
    return outputs, alpha


def branch_mix(plain, syntax, alpha):
    """`H_self = α · Att_self(H) + (1 − α) · AttSyn_self(H)` (survey §3.3)."""
    return alpha * np.asarray(plain, np.float64) + (1 - alpha) * np.asarray(syntax, np.float64)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def shared_map_groups(num_layers, k):
    """For each layer, the index of the layer whose attention map it uses (§5.4): layers
    `0, k, 2k, …` compute their own; the next `k − 1` layers reuse it."""
    return [layer - layer % k for layer in range(num_layers)]
