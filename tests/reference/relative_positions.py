"""Numpy oracle for relative positions in the attention scores: RPR (survey §4.1.3), T5
buckets (Raffel et al., cited there) and ALiBi (Press et al., cited in the summary, §7).

Written from the equations, in float64, one pair (i, j) at a time where the equation is
stated per pair; the attention itself is the survey's §2.3 with the mask of §2.6.
"""

import math

import numpy as np

from tests.reference.attention import softmax_with_mask


def clip(x, k_rpr):
    """`clip(x, k_rpr) = max{−k_rpr, min{x, k_rpr}}` (§4.1.3)."""
    return max(-k_rpr, min(x, k_rpr))


def pair_table(table, query_positions, key_positions, k_rpr):
    """`PE(i, j) = u_{clip(j−i, k_rpr)}` for every pair, `[T, S, d]`; row `π + k_rpr` of the
    table `U_rpr = [u_{−k_rpr}; …; u_0; …; u_{k_rpr}]` holds `u_π`."""
    out = np.zeros((len(query_positions), len(key_positions), table.shape[-1]))
    for a, i in enumerate(query_positions):
        for b, j in enumerate(key_positions):
            out[a, b] = table[clip(j - i, k_rpr) + k_rpr]
    return out


def rpr_attention(q, k, v, k_rpr, key_table, query_table=None, value_table=None,
                  query_positions=None, key_positions=None, mask=None, scale=None):
    """RPR self-attention per head (§4.1.3), for `q [B, H, T, d]`, `k, v [B, H, S, d]`:

    `α_ij = Softmax([h_iᵠ + PEᵠ(i,j)] [h_jᵏ + PEᵏ(i,j)]ᵀ · scale)` and
    `c_i = Σ_j α_ij [h_jᵛ + PEᵛ(i,j)]`; a missing query (value) table means `PEᵠ = 0`
    (`PEᵛ = 0`), which gives Shaw et al.'s form.

    Returns `(c [B, H, T, d], α [B, H, T, S])`.
    """
    T, S, d = q.shape[2], k.shape[2], q.shape[-1]
    query_positions = np.arange(T) if query_positions is None else query_positions
    key_positions = np.arange(S) if key_positions is None else key_positions
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    zeros = np.zeros((T, S, d))
    pe_k = pair_table(key_table, query_positions, key_positions, k_rpr)
    pe_q = zeros if query_table is None else pair_table(query_table, query_positions, key_positions, k_rpr)
    pe_v = zeros if value_table is None else pair_table(value_table, query_positions, key_positions, k_rpr)
    queries = q[:, :, :, None, :] + pe_q[None, None]  # [B, H, T, S, d]
    keys = k[:, :, None, :, :] + pe_k[None, None]
    values = v[:, :, None, :, :] + pe_v[None, None]
    scores = np.sum(queries * keys, axis=-1) * scale
    alpha = softmax_with_mask(scores, mask)
    return np.sum(alpha[..., None] * values, axis=3), alpha


def t5_bucket(relative_position, num_buckets, max_distance, bidirectional):
    """T5's bucket of one relative position `j − i` (Raffel et al., mesh-tensorflow's rule)."""
    n = -relative_position
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


def t5_bias(table, query_positions, key_positions, max_distance, bidirectional):
    """`b_{h, bucket(j − i)}` as `[H, T, S]` from a table `[num_buckets, H]`."""
    num_buckets, heads = table.shape
    out = np.zeros((heads, len(query_positions), len(key_positions)))
    for a, i in enumerate(query_positions):
        for b, j in enumerate(key_positions):
            out[:, a, b] = table[t5_bucket(j - i, num_buckets, max_distance, bidirectional)]
    return out


def alibi_slopes(n):
    """ALiBi's slopes as in Press et al.'s reference code: `2^(−8h/n)` for a power of two
    `n`, else those of the closest lower power of two `P` and every other slope of `2P`."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


def alibi_bias(num_heads, query_positions, key_positions):
    """`−m_h · |i − j|` as `[H, T, S]` (`−m_h · (i − j)` on causal pairs)."""
    slopes = np.asarray(alibi_slopes(num_heads))
    i = np.asarray(query_positions)[:, None]
    j = np.asarray(key_positions)[None, :]
    return -slopes[:, None, None] * np.abs(i - j)[None]


def project_heads(x, weights, num_heads, num_key_value_heads=None):
    """`q, k, v` as `[B, H, T, d_h]` from `x [B, T, d]` and `MultiHeadAttention`-layout
    weights (`wq [d, H, d_h]`, biases `bq [H, d_h]` …); key/value heads repeated for GQA."""
    num_key_value_heads = num_key_value_heads or num_heads
    group = num_heads // num_key_value_heads

    def project(name):
        out = np.einsum("btd,dhk->bhtk", x, weights["w" + name])
        if weights.get("b" + name) is not None:
            out = out + weights["b" + name][None, :, None, :]
        return out

    k, v = (np.repeat(project(n), group, axis=1) for n in ("k", "v"))
    return project("q"), k, v


def merge_heads(context, weights):
    """`Merge(C₁ … C_τ) W_c`: `[B, H, T, d_h]` to `[B, T, d_out]`."""
    out = np.einsum("bhtk,hkd->btd", context, weights["wo"])
    return out + weights["bo"] if weights.get("bo") is not None else out
