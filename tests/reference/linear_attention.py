"""Numpy linear attention (survey §5.3.2, §5.5.2), written as the naive per-step recurrences.

Shapes per head: `q, k, v` are `[B, T, H, Dh]`; `φ(q), φ(k)` are `[B, T, H, m]`; the state is
`μ [B, H, m, Dh]` and `ν [B, H, m]`.
"""

import numpy as np


def feature_map(x, kind, projection=None):
    """`φ(x)`: `elu(x) + 1`, `relu(x)`, `x`, the second-order Taylor features
    `[1, x′, x′_i x′_j / √2 (all i, j)]`, or the positive random features
    `exp(ωᵀx′ − |x′|²/2)/√m`, each of `x′ = x / d_h^{1/4}` (Performer, FAVOR+)."""
    x = np.asarray(x, np.float64)
    if kind == "elu":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "identity":
        return x
    if kind == "taylor":
        x = x * x.shape[-1] ** -0.25
        d = x.shape[-1]
        out = np.empty(x.shape[:-1] + (1 + d + d * d,))
        out[..., 0] = 1.0
        out[..., 1:1 + d] = x
        for i in range(d):
            for j in range(d):
                out[..., 1 + d + i * d + j] = x[..., i] * x[..., j] / np.sqrt(2.0)
        return out
    if kind == "random_features":
        x = x * x.shape[-1] ** -0.25
        m = projection.shape[-1]
        exponent = x @ np.asarray(projection, np.float64) - 0.5 * np.sum(x * x, -1, keepdims=True)
        return np.exp(exponent) / np.sqrt(m)
    raise ValueError(kind)


def softmax_attention(q, k, v):
    """`Softmax(q kᵀ/√d_h) v`, the kernel that the random features approximate."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, v)


def linear_attention(qf, kf, v, causal, padding_mask=None, decay=None, normalize=True,
                     state=None, epsilon=1e-6):
    """Linear attention from feature-mapped queries and keys.

    Non-causal: `c_i = q′_i μ_n / q′_i ν_n`, `μ_n = Σ_j k′_jᵀ v_j`, `ν_n = Σ_j k′_jᵀ` over the
    unpadded keys. Causal, step by step: `μ_j = a_j μ_{j−1} + (1 − a_j) k′_jᵀ v_j`,
    `ν_j = a_j ν_{j−1} + (1 − a_j) k′_jᵀ` (`a_j = 0` means no decay and no `(1 − a)` factor, i.e.
    `μ_j = μ_{j−1} + k′_jᵀ v_j`), `c_j = q′_j μ_j / max(q′_j ν_j, ε)`; a padded position leaves the
    state unchanged. `decay`: `None` or `a_j`, `[B, T, H]`.

    Returns:
        `(outputs [B, T, H, Dh], (μ, ν))`, the state after the last position.
    """
    qf, kf, v = (np.asarray(t, np.float64) for t in (qf, kf, v))
    batch, length, heads, m = qf.shape
    dim = v.shape[-1]
    valid = np.ones((batch, length), bool) if padding_mask is None else np.asarray(padding_mask, bool)
    if state is None:
        mu, nu = np.zeros((batch, heads, m, dim)), np.zeros((batch, heads, m))
    else:
        mu, nu = (np.array(s, np.float64) for s in state)
    outputs = np.zeros((batch, length, heads, dim))

    def read(b, t, h, mu_bh, nu_bh):
        numerator = qf[b, t, h] @ mu_bh
        if not normalize:
            return numerator
        return numerator / max(qf[b, t, h] @ nu_bh, epsilon)

    for b in range(batch):
        for h in range(heads):
            if not causal:
                mu_n = sum(np.outer(kf[b, j, h], v[b, j, h]) for j in range(length) if valid[b, j])
                nu_n = sum(kf[b, j, h] for j in range(length) if valid[b, j])
                mu_n = np.zeros((m, dim)) if np.isscalar(mu_n) else mu_n
                nu_n = np.zeros(m) if np.isscalar(nu_n) else nu_n
                for i in range(length):
                    outputs[b, i, h] = read(b, i, h, mu_n, nu_n)
                continue
            for j in range(length):
                if valid[b, j]:
                    a = 0.0 if decay is None else float(decay[b, j, h])
                    keep, write = (1.0, 1.0) if decay is None else (a, 1.0 - a)
                    mu[b, h] = keep * mu[b, h] + write * np.outer(kf[b, j, h], v[b, j, h])
                    nu[b, h] = keep * nu[b, h] + write * kf[b, j, h]
                outputs[b, j, h] = read(b, j, h, mu[b, h], nu[b, h])
    return outputs, (mu, nu)


def key_convolution(k, kernel, padding_mask=None, window=None):
    """The causal depthwise convolution of the keys, `k̃_t = Σ_{o<K} w_o ⊙ k_{t−o}`, written as
    a loop: keys before the first position are zero (or `window`, the `K − 1` keys before it,
    oldest first), and a padded position's key is zero. `k`: `[B, T, H, Dh]`, `kernel`:
    `[K, H, Dh]`.

    Returns:
        `(k̃ [B, T, H, Dh], the last K − 1 keys [B, K − 1, H, Dh])`.
    """
    k = np.array(k, np.float64)
    kernel = np.asarray(kernel, np.float64)
    size = kernel.shape[0]
    if padding_mask is not None:
        k = k * np.asarray(padding_mask, np.float64)[:, :, None, None]
    if window is None:
        window = np.zeros((k.shape[0], size - 1) + k.shape[2:])
    history = np.concatenate([np.asarray(window, np.float64), k], axis=1)
    out = np.zeros_like(k)
    for t in range(k.shape[1]):
        for o in range(size):
            out[:, t] += kernel[o] * history[:, size - 1 + t - o]
    return out, history[:, history.shape[1] - (size - 1):]
