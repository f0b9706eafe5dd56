"""Numpy oracle for survey §5.6 (skipping models): a classifier decides, for each input
sequence, whether a layer runs or is skipped (the identity).

Written from the equations with explicit loops over the sequences, in float64.
"""

import numpy as np


def _sigmoid(s):
    return 1.0 / (1.0 + np.exp(-np.asarray(s, np.float64)))


def _mask(x, padding_mask):
    if padding_mask is None:
        return np.ones(x.shape[:2], bool)
    return np.asarray(padding_mask, bool)


def pooled(x, padding_mask=None):
    """The mean of each sequence's real tokens, zeros for a sequence without one, `[B, d]`."""
    mask = _mask(x, padding_mask)
    out = np.zeros((x.shape[0], x.shape[2]))
    for b in range(x.shape[0]):
        if mask[b].any():
            out[b] = np.asarray(x[b], np.float64)[mask[b]].mean(axis=0)
    return out


def run_probability(x, kernel, bias, padding_mask=None):
    """`p_b = σ(w · mean_{j real} h_{b,j} + b)`, `[B]`."""
    return _sigmoid(pooled(x, padding_mask) @ np.asarray(kernel, np.float64) + float(bias))


def layer_skip_gate(x, fx, kernel, bias, threshold, padding_mask=None, gate="straight_through",
                    training=False):
    """`h′_b = f(h)_b` when `p_b ≥ τ` and sequence `b` has a real token, `h_b` otherwise;
    with `gate="multiply"` in training `h′_b = h_b + p_b (f(h)_b − h_b)` (no threshold).
    Returns (`h′` `[B, T, d]`, `p` `[B]`, whether the layer ran `[B]`)."""
    mask = _mask(x, padding_mask)
    p = run_probability(x, kernel, bias, padding_mask)
    outputs = np.array(x, np.float64)
    run = np.zeros(x.shape[0], bool)
    for b in range(x.shape[0]):
        if not mask[b].any():
            continue
        run[b] = p[b] >= threshold
        if training and gate == "multiply":
            outputs[b] = x[b] + p[b] * (fx[b] - x[b])
        elif run[b]:
            outputs[b] = fx[b]
    return outputs, p, run


def compute_loss(x, kernel, bias, weight, padding_mask=None):
    """`λ · mean_b p_b` over the sequences with a real token."""
    mask = _mask(x, padding_mask)
    active = mask.any(axis=1)
    if not active.any():
        return 0.0
    return weight * run_probability(x, kernel, bias, padding_mask)[active].mean()


def bias_gradient(x, fx, kernel, bias, upstream, padding_mask=None):
    """`∂L/∂b = Σ_b σ′(s_b) ⟨∂L/∂h′_b, f(h)_b − h_b⟩` over the sequences with a real token,
    for `h′ = h + g (f(h) − h)` with `g = σ(s)` or its straight-through form; and
    `∂L/∂w = Σ_b (the same term) · mean_{j real} h_{b,j}`. Returns (`∂L/∂w`, `∂L/∂b`)."""
    mask = _mask(x, padding_mask)
    p = run_probability(x, kernel, bias, padding_mask)
    means = pooled(x, padding_mask)
    grad_w, grad_b = np.zeros(x.shape[2]), 0.0
    for b in range(x.shape[0]):
        if not mask[b].any():
            continue
        term = p[b] * (1 - p[b]) * np.sum(upstream[b] * (fx[b] - x[b]))
        grad_b += term
        grad_w += term * means[b]
    return grad_w, grad_b


def layer_skipping(h, layers, kernels, biases, threshold, padding_mask=None):
    """An encoder whose layer `l` runs for sequence `b` when `p_{l,b} ≥ τ` (computed on the
    sequence's state before the layer), one sequence at a time. `layers[l](h_b [T, d],
    mask_b [T])` is layer `l` on one sequence. Returns (final states `[B, T, d]`, whether
    each layer ran for each sequence, `[B, L]`)."""
    mask = _mask(h, padding_mask)
    states = np.array(h, np.float64)
    executed = np.zeros((h.shape[0], len(layers)), bool)
    for b in range(h.shape[0]):
        for l, layer in enumerate(layers):
            p = run_probability(states[b:b + 1], kernels[l], biases[l], mask[b:b + 1])[0]
            if mask[b].any() and p >= threshold:
                states[b] = layer(states[b], mask[b])
                executed[b, l] = True
    return states, executed
