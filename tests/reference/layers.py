"""Numpy oracle for survey §2.4 and §2.5: layer normalisation, post/pre-norm sub-layers, FFN."""

import numpy as np
from math import erf


def layer_norm(h, gamma=None, beta=None, epsilon=1e-5):
    """`LNorm(h) = α ⊙ (h − μ) / √(σ² + ε) + β` (§2.4; Keras puts ε inside the root)."""
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    out = (h - mu) / np.sqrt(var + epsilon)
    if gamma is not None:
        out = out * gamma
    if beta is not None:
        out = out + beta
    return out


def layer_norm_survey(h, epsilon):
    """The survey's exact form `(h − μ) / (σ + ε)` with α = 1, β = 0 (§2.4 worked example)."""
    mu = h.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((h - mu) ** 2).mean(axis=-1, keepdims=True))
    return (h - mu) / (sigma + epsilon)


def rms_norm(h, gamma=None, epsilon=1e-5):
    out = h / np.sqrt((h**2).mean(axis=-1, keepdims=True) + epsilon)
    return out if gamma is None else out * gamma


def post_norm(f, h, norm):
    """`H_out = LNorm(F(H_in) + H_in)` (§2.4)."""
    return norm(f(h) + h)


def pre_norm(f, h, norm):
    """`H_out = F(LNorm(H_in)) + H_in` (§2.4)."""
    return f(norm(h)) + h


def relu(x):
    return np.maximum(x, 0.0)


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2, BERT)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def ffn(h, w_h, b_h, w_f, b_f, activation=relu, w_g=None, b_g=None):
    """`FFN(H) = act(H W_h + b_h) W_f + b_f` (§2.5), or the gated
    `(act(H W_g + b_g) ⊙ (H W_h + b_h)) W_f + b_f` when `w_g` is given."""
    hidden = h @ w_h + (0.0 if b_h is None else b_h)
    if w_g is not None:
        hidden = activation(h @ w_g + (0.0 if b_g is None else b_g)) * hidden
    else:
        hidden = activation(hidden)
    return hidden @ w_f + (0.0 if b_f is None else b_f)
