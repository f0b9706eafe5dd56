"""Numpy mixture of experts from the survey's equations (§4.4, §5.6), token by token.

`g(h) = Softmax(h · W_g)`; `π` = the top-k experts; `h_out = Σ_{i∈π} g_i(h) · FFN_i(h)`.
Capacity is simulated by visiting the assignments in priority order (all first choices, then
all second choices, …; tokens in order within a choice) and dropping those that find their
expert full.
"""

import math
from math import erf

import numpy as np

GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def activation(name, x):
    name = GATED.get(name, name)
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    raise ValueError(name)


def route(h, kernel, bias=None, top_k=1, order="softmax_then_topk", normalize_top_k=True):
    """`(expert_index [N, k], gates [N, k], probabilities [N, M], logits [N, M])`."""
    logits = h @ kernel + (0.0 if bias is None else bias)
    probabilities = softmax(logits)
    # Stable descending order, ties to the lower index (as `top_k`).
    index = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]
    if order == "softmax_then_topk":
        gates = np.take_along_axis(probabilities, index, -1)
        if normalize_top_k:
            gates = gates / gates.sum(-1, keepdims=True)
    else:
        gates = softmax(np.take_along_axis(logits, index, -1))
    return index, gates, probabilities, logits


def expert(h, i, name, w_in, w_out, w_gate=None, b_in=None, b_out=None, b_gate=None):
    """`FFN_i(h) = σ(h W_h^i + b_h^i) W_f^i + b_f^i` (gated: `σ(h W_g^i + b_g^i) ⊙ (h W_h^i +
    b_h^i)`)."""
    hidden = h @ w_in[i] + (0.0 if b_in is None else b_in[i])
    if w_gate is not None:
        gate = h @ w_gate[i] + (0.0 if b_gate is None else b_gate[i])
        hidden = activation(name, gate) * hidden
    else:
        hidden = activation(name, hidden)
    return hidden @ w_out[i] + (0.0 if b_out is None else b_out[i])


def kept_assignments(index, valid, num_experts, capacity):
    """Boolean `[N, k]`: which assignments find room (`capacity=None`: all valid ones)."""
    n, k = index.shape
    kept = np.zeros((n, k), bool)
    used = np.zeros(num_experts, int)
    for j in range(k):
        for t in range(n):
            if not valid[t]:
                continue
            e = index[t, j]
            if capacity is None or used[e] < capacity:
                kept[t, j] = True
                used[e] += 1
    return kept


def mixture_of_experts(h, index, gates, kept, expert_fn):
    """`h_out[t] = Σ_{j: kept} g_tj · FFN_{π_tj}(h_t)` over `[N, d]` tokens."""
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(index.shape[1]):
            if kept[t, j]:
                out[t] += gates[t, j] * expert_fn(h[t : t + 1], index[t, j])[0]
    return out


def load_balance_loss(index, probabilities, valid, num_experts):
    """Switch: `M · Σ_i f_i · P_i` over valid tokens, `f_i` the fraction of assignments."""
    counts = np.array([(index[valid] == i).sum() for i in range(num_experts)], float)
    fraction = counts / (valid.sum() * index.shape[1])
    return num_experts * np.sum(fraction * probabilities[valid].mean(0))


def z_loss(logits, valid):
    """`mean(logsumexp(logits)²)` over valid tokens."""
    top = logits.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
    return np.mean(lse[valid] ** 2)
