"""Numpy oracle for survey §4.1.1 (priors for local modelling): the penalty matrix `G` and the
additive, mixture and multiplicative ways of bringing it into attention.

Written from the equations in float64. Heads are on axis 1: queries `[B, H, T, Dh]`, scores
`[B, H, T, S]`. `P = min(γ·G, 10⁴)` and `σ_i ≥ 10⁻³` follow the library's documented caps.
"""

import numpy as np

from tests.reference.attention import softmax_with_mask

MAX_PENALTY = 1e4
MIN_SIGMA = 1e-3


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def distance_matrix(query_positions, key_positions, distance, sigma=None):
    """`G(i, j) = |i − j|` or `(i − j)² / (2σ²)`, `[T, S]`."""
    i = np.asarray(query_positions, np.float64)[:, None]
    j = np.asarray(key_positions, np.float64)[None, :]
    if distance == "absolute":
        return np.abs(i - j)
    return (i - j) ** 2 / (2.0 * sigma**2)


def predicted_distance(q, source_length, w, u):
    """`G(i, j) = (μ_i − j)² / (2σ_i²)` with `h_i = tanh(q_i W)`, `μ_i = (S − 1)·sigmoid(h_i u_μ)`,
    `σ_i = S·sigmoid(h_i u_σ) / 2` (Yang et al. 2018); `q` is `[B, H, T, Dh]`, result
    `[B, H, T, S]`."""
    hidden = np.tanh(q @ w)
    logits = hidden @ u
    mu = (source_length - 1) * _sigmoid(logits[..., 0:1])
    sigma = np.maximum(source_length * _sigmoid(logits[..., 1:2]) / 2.0, MIN_SIGMA)
    j = np.arange(source_length, dtype=np.float64)
    return (mu - j) ** 2 / (2.0 * sigma**2)


def penalty(g, gamma):
    """`P = min(γ·G, 10⁴)`; `gamma` a float or one value per head."""
    gamma = np.asarray(gamma, np.float64)
    if gamma.ndim == 1:
        gamma = gamma[None, :, None, None]
    return np.minimum(gamma * g, MAX_PENALTY)


def multiplier(p):
    """`G′(i, j) = exp(−(P(i, j) − min_j P(i, j)))`: the row-max-normalised `Softmax_j(−P)`."""
    return np.exp(np.min(p, axis=-1, keepdims=True) - p)


def gate(q, w, b):
    """`β_i = sigmoid(q_i·w_β + b_β)`, `[B, H, T, 1]`."""
    return _sigmoid(q @ w + b)


def attention_with_priors(q, k, v, additive=(), multiplicative=None, mixtures=(), mask=None):
    """Attention weights and context with locality priors, each given by its penalty `P`
    (broadcastable to the scores):

    - additive: `Softmax(q·kᵀ/√d − Σ P)`;
    - multiplicative: `Softmax((q·kᵀ/√d − Σ P) ⊙ G′)`;
    - mixtures `(P, β)`, in order: `α ← (1 − β)·α + β·Softmax(−P)`, every softmax masked.
    """
    scores = np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])
    for p in additive:
        scores = scores - p
    if multiplicative is not None:
        scores = scores * multiplier(np.broadcast_to(multiplicative, scores.shape))
    weights = softmax_with_mask(scores, mask)
    for p, beta in mixtures:
        prior = softmax_with_mask(np.broadcast_to(-p, scores.shape), mask)
        weights = (1.0 - beta) * weights + beta * prior
    return np.einsum("bhts,bhsd->bhtd", weights, v), weights


def project(query_input, kv_input, weights, num_heads, num_key_value_heads):
    """The projected `q [B, H, T, Dh]`, `k`, `v [B, H, S, Dh]` (kv heads repeated)."""
    group = num_heads // num_key_value_heads
    q = np.einsum("btd,dhk->bhtk", query_input, weights["wq"]) + weights["bq"][None, :, None]
    k = np.einsum("bsd,dhk->bhsk", kv_input, weights["wk"]) + weights["bk"][None, :, None]
    v = np.einsum("bsd,dhk->bhsk", kv_input, weights["wv"]) + weights["bv"][None, :, None]
    return q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def output(context, weights):
    return np.einsum("bhtk,hkd->btd", context, weights["wo"]) + weights["bo"]
