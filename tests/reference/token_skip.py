"""Numpy oracle for survey §5.6 (learning to skip tokens): a classifier `Pr(nonskip | h_i) =
σ(s_i)` decides which tokens a layer processes; the others pass through unchanged.

Written from the equations with explicit loops, in float64.
"""

import math

import numpy as np


def _sigmoid(s):
    return 1.0 / (1.0 + np.exp(-np.asarray(s, np.float64)))


def _layer_on_gathered(x, scores, block, capacity, threshold, padding_mask, soft):
    """The `k = ⌈c·n⌉` real tokens of highest score (fewer when a row has fewer real
    tokens), in their original order; among them a token is processed unless
    `1 − σ(s_i) > threshold` (every one of them with `soft`). `block(rows [B, k, d],
    mask [B, k])` is the layer on the gathered tokens, the mask marking the processed ones
    (the keys they may attend to); rows past a row's real tokens are zeros, masked.

    Returns (chosen positions per row, the processed mask `[B, k]`, the layer's `[B, k, d]`)."""
    batch, length, width = x.shape
    valid = np.ones((batch, length), bool) if padding_mask is None else np.asarray(padding_mask)
    keep = max(1, math.ceil(round(capacity * length, 9)))
    probability = _sigmoid(scores)
    rows = np.zeros((batch, keep, width))
    mask = np.zeros((batch, keep), bool)
    chosen = []
    for b in range(batch):
        real = [i for i in range(length) if valid[b, i]]
        picked = sorted(sorted(real, key=lambda i: -scores[b, i])[:keep])
        chosen.append(picked)
        for j, i in enumerate(picked):
            rows[b, j] = x[b, i]
            mask[b, j] = soft or 1.0 - probability[b, i] <= threshold
    return chosen, mask, block(rows, mask)


def token_skip(x, scores, block, capacity, threshold, padding_mask=None, gate="straight_through",
               training=False):
    """`h′_i = f(h)_i` for the processed tokens, `h_i` for the others; with
    `gate="multiply"` in training, `h′_i = h_i + σ(s_i)·(f(h)_i − h_i)` for every gathered
    real token (the threshold is not applied).

    Returns (`[B, n, d]` outputs, boolean `[B, n]` processed tokens)."""
    soft = training and gate == "multiply"
    chosen, mask, updated = _layer_on_gathered(x, scores, block, capacity, threshold,
                                               padding_mask, soft)
    probability = _sigmoid(scores)
    outputs = np.array(x, np.float64)
    processed = np.zeros(x.shape[:2], bool)
    for b, picked in enumerate(chosen):
        for j, i in enumerate(picked):
            if soft:
                outputs[b, i] = x[b, i] + probability[b, i] * (updated[b, j] - x[b, i])
            elif mask[b, j]:
                outputs[b, i] = updated[b, j]
            processed[b, i] = mask[b, j]
    return outputs, processed


def scorer_gradient(x, scores, block, capacity, threshold, upstream, padding_mask=None,
                    gate="straight_through"):
    """`∂L/∂s_i = σ′(s_i) · ⟨∂L/∂h′_i, f(h)_i − h_i⟩` in training, for the gathered real
    tokens (zero for the others), with `upstream = ∂L/∂h′` `[B, n, d]`: the gradient of
    `h′_i = h_i + g_i (f(h)_i − h_i)` with `g_i = σ(s_i)` (`"multiply"`) or its
    straight-through form (the same gradient). Returns `[B, n]`."""
    soft = gate == "multiply"
    chosen, _, updated = _layer_on_gathered(x, scores, block, capacity, threshold,
                                            padding_mask, soft)
    probability = _sigmoid(scores)
    gradient = np.zeros(x.shape[:2])
    for b, picked in enumerate(chosen):
        for j, i in enumerate(picked):
            slope = probability[b, i] * (1.0 - probability[b, i])
            gradient[b, i] = slope * np.dot(upstream[b, i], updated[b, j] - x[b, i])
    return gradient


def rate_loss(scores, target_rate, weight, padding_mask=None):
    """`λ · (mean_i σ(s_i) − ρ*)²` over the real tokens."""
    valid = np.ones(scores.shape, bool) if padding_mask is None else np.asarray(padding_mask)
    rate = _sigmoid(scores)[valid].mean() if valid.any() else 0.0
    return weight * (rate - target_rate) ** 2
