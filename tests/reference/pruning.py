"""Numpy oracle for structured pruning (survey §5.7): attention and feedforward with a mask
on their heads and units, `Σ_h ξ_h C_h W_o[h]` and `(ξ ⊙ act(H W_h)) W_f`, in float64."""

import numpy as np

from tests.reference.attention import qkv_attention
from tests.reference.layers import relu


def masked_multi_head_attention(x, weights, num_heads, num_key_value_heads, head_mask,
                                mask=None):
    """Self-attention whose head `h` contributes `ξ_h C_h W_o[h]` (`head_mask` = `ξ`).

    `weights`: `wq [d, H, Dh]`, `wk`, `wv [d, Hkv, Dh]`, `wo [H, Dh, d]`, biases `bq [H, Dh]`,
    `bk`, `bv [Hkv, Dh]`, `bo [d]`; query head `h` uses key/value head `h // (H / Hkv)`."""
    group = num_heads // num_key_value_heads
    outputs = np.zeros(x.shape[:2] + (weights["wo"].shape[-1],)) + weights["bo"]
    for h in range(num_heads):
        g = h // group
        q = x @ weights["wq"][:, h] + weights["bq"][h]
        k = x @ weights["wk"][:, g] + weights["bk"][g]
        v = x @ weights["wv"][:, g] + weights["bv"][g]
        context, _ = qkv_attention(q, k, v, mask=mask)
        outputs = outputs + head_mask[h] * context @ weights["wo"][h]
    return outputs


def masked_feedforward(x, w_h, b_h, w_f, b_f, unit_mask, activation=relu, w_g=None, b_g=None):
    """`(ξ ⊙ act(H W_h + b_h)) W_f + b_f`, or with the gated hidden layer
    `act(H W_g + b_g) ⊙ (H W_h + b_h)` (`unit_mask` = `ξ`)."""
    hidden = x @ w_h + b_h
    hidden = activation(x @ w_g + b_g) * hidden if w_g is not None else activation(hidden)
    return (hidden * unit_mask) @ w_f + b_f
