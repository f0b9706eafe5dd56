"""Numpy oracle for survey §5.1 (sparse attention): the attention fields `π_i` as boolean
`[T, S]` (or `[B, H, T, S]`) masks, `True` where key `j ∈ π_i`, written from the definitions
with explicit loops over the positions."""

import numpy as np


def dilated_field(query_positions, key_positions, window, dilation, causal=False):
    """`π_i = {j : i − j = m·d or (not causal) j − i = m·d, m = 0 … w}`."""
    mask = np.zeros((len(query_positions), len(key_positions)), bool)
    for a, i in enumerate(query_positions):
        field = {i - m * dilation for m in range(window + 1)}
        if not causal:
            field |= {i + m * dilation for m in range(window + 1)}
        for b, j in enumerate(key_positions):
            mask[a, b] = j in field
    return mask


def global_field(query_positions, key_positions, global_positions):
    """`(i, j)` allowed when `i ∈ G` or `j ∈ G`."""
    g = set(global_positions)
    return np.array([[i in g or j in g for j in key_positions] for i in query_positions])


def random_field(query_positions, key_positions, table):
    """`π_i = R_i`, the keys listed in row `i` of the drawn table `[L, r]` (−1 = none)."""
    mask = np.zeros((len(query_positions), len(key_positions)), bool)
    for a, i in enumerate(query_positions):
        if i < len(table):
            row = set(int(j) for j in table[i] if j >= 0)
            mask[a] = [j in row for j in key_positions]
    return mask


def union(*masks):
    """Hybrid field: `π_i = ∪_k π_i^(k)`, masks broadcast to a common shape."""
    out = np.zeros(np.broadcast_shapes(*(m.shape for m in masks)), bool)
    for m in masks:
        out = out | m
    return out


def lsh_buckets(x, rotations):
    """`h(x) = argmax([xR; −xR])` for `x` `[B, L, H, Dh]`, `R` `[Dh, n, b/2]` → `[B, H, n, L]`."""
    rotated = np.einsum("blhd,dnk->bhnlk", np.asarray(x, np.float64), rotations)
    return np.argmax(np.concatenate([rotated, -rotated], axis=-1), axis=-1)


def hashing_field(query, key, rotations, chunk_size=None):
    """`π_i = {j : h(q_i) = h(k_j)}` in any round; with `chunk_size`, the sort-and-chunk field:
    queries and keys each sorted by (bucket, position), chunk `c` attends to chunks `c, c−1`.
    `query` `[B, T, H, Dh]`, `key` `[B, S, H, Dh]` → `[B, H, T, S]`."""
    bq, bk = lsh_buckets(query, rotations), lsh_buckets(key, rotations)
    batch, heads, rounds, t = bq.shape
    s = bk.shape[-1]
    mask = np.zeros((batch, heads, t, s), bool)
    for b in range(batch):
        for h in range(heads):
            for n in range(rounds):
                if chunk_size is None:
                    mask[b, h] |= bq[b, h, n][:, None] == bk[b, h, n][None, :]
                    continue
                q_order = sorted(range(t), key=lambda i: (bq[b, h, n, i], i))
                k_order = sorted(range(s), key=lambda j: (bk[b, h, n, j], j))
                q_chunk = {i: r // chunk_size for r, i in enumerate(q_order)}
                k_chunk = {j: r // chunk_size for r, j in enumerate(k_order)}
                for i in range(t):
                    for j in range(s):
                        if k_chunk[j] in (q_chunk[i], q_chunk[i] - 1):
                            mask[b, h, i, j] = True
    return mask


def cluster_ids(x, centroids, epsilon=1e-6):
    """`c(x) = argmax_c x̂·μ̂_c` for `x` `[B, L, H, Dh]`, `μ` `[H, C, Dh]` → `[B, H, L]`."""
    x = np.asarray(x, np.float64)
    x = x / np.sqrt(np.sum(x**2, -1, keepdims=True) + epsilon**2)
    mu = centroids / np.sqrt(np.sum(centroids**2, -1, keepdims=True) + epsilon**2)
    return np.transpose(np.argmax(np.einsum("blhd,hcd->blhc", x, mu), -1), (0, 2, 1))


def clustering_field(query, key, centroids):
    """`π_i = {j : c(q_i) = c(k_j)}` → `[B, H, T, S]`."""
    cq, ck = cluster_ids(query, centroids), cluster_ids(key, centroids)
    return cq[..., :, None] == ck[..., None, :]


def ema_centroids(query, key, centroids, decay, epsilon=1e-6):
    """One online k-means step: `μ_c ← λ μ_c + (1 − λ) mean{x̂ : c(x) = c}` per head."""
    new = np.array(centroids, np.float64)
    states = [np.asarray(a, np.float64) for a in (query, key)]
    units = [a / np.sqrt(np.sum(a**2, -1, keepdims=True) + epsilon**2) for a in states]
    ids = [cluster_ids(a, centroids, epsilon) for a in states]  # [B, H, L]
    for h in range(new.shape[0]):
        for c in range(new.shape[1]):
            members = [u[:, :, h][i[:, h] == c] for u, i in zip(units, ids)]
            members = np.concatenate(members, axis=0)
            if len(members):
                new[h, c] = decay * centroids[h, c] + (1 - decay) * members.mean(0)
    return new
