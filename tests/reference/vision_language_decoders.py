"""Numpy oracle for survey §6.5 decoders: the prefix-LM field and Flamingo's tanh gate.

Written from the equations, in float64.
"""

import numpy as np

from tests.reference.attention import multi_head_attention
from tests.reference.layers import ffn
from tests.reference.layers import layer_norm


def prefix_lm_mask(query_length, key_length, prefix_length, offset=0):
    """`allowed(i, j) = j < N or j ≤ i`: the `N` prefix (image) positions see each other
    bidirectionally, later (text) positions see the prefix and earlier text."""
    i = np.arange(query_length)[:, None] + offset
    j = np.arange(key_length)[None, :]
    return (j < prefix_length) | (j <= i)


def tanh_gate(inputs, update, alpha):
    """`x + tanh(α) · F(x)`: a residual branch behind a tanh gate (`α = 0`: closed)."""
    return inputs + np.tanh(alpha) * update


def gated_cross_attention(x, image, attention_weights, num_heads, norm_1, alpha_attention,
                          ffn_weights=None, norm_2=None, alpha_ffn=None):
    """The gated sub-layers in front of a decoder layer (Flamingo's GATED XATTN-DENSE):

        y = x + tanh(α_xattn) · CrossAttn(LNorm(x), H_img)
        z = y + tanh(α_ffn) · FFN(LNorm(y))

    `norm_*` are `(γ, β)` pairs, `attention_weights` as in `multi_head_attention`,
    `ffn_weights` `(W_h, b_h, W_f, b_f)`. Returns `z` (the decoder layer's input).
    """
    attended, _ = multi_head_attention(layer_norm(x, *norm_1), image, attention_weights,
                                       num_heads)
    y = tanh_gate(x, attended, alpha_attention)
    if ffn_weights is None:
        return y
    return tanh_gate(y, ffn(layer_norm(y, *norm_2), *ffn_weights), alpha_ffn)
