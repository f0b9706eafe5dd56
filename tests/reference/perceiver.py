"""Numpy oracle for survey §5.7 (sequence compression by learned latent queries).

`r` hidden representations `U = {u_1 … u_r}` are the queries of a QKV attention whose keys and
values are the inputs `X` (Perceiver), or the inputs followed by the latents (Flamingo's
resampler). Each layer is pre-norm (§2.4): `U ← U + MHA(LN(U), LN(X))`, `U ← U + FFN(LN(U))`;
the result is `LN(U)`. Float64 throughout.
"""

import numpy as np

from tests.reference.attention import multi_head_attention
from tests.reference.layers import gelu
from tests.reference.layers import ffn
from tests.reference.layers import layer_norm


def resampler_layer(latents, inputs, params, num_heads, padding_mask=None,
                    attend_to_latents=False, activation=gelu, epsilon=1e-5):
    """One layer: `U + MHA(LN_q(U), KV)` then `+ FFN(LN_f(·))`, `KV = LN_x(X)` or
    `[LN_x(X); LN_q(U)]`.

    Args:
        latents: `[B, r, d]`; inputs: `[B, m, d]`.
        params: dict with `input_norm`, `latent_norm`, `feedforward_norm` (each `(γ, β)`),
            `attention` (the weights dict of `multi_head_attention`) and `feedforward`
            (`(W_h, b_h, W_f, b_f)`).
        padding_mask: boolean `[B, m]`, True for real inputs.
    """
    query = layer_norm(latents, *params["latent_norm"], epsilon=epsilon)
    context = layer_norm(inputs, *params["input_norm"], epsilon=epsilon)
    batch, m = inputs.shape[:2]
    keep = np.ones((batch, m), bool) if padding_mask is None else np.asarray(padding_mask, bool)
    if attend_to_latents:
        context = np.concatenate([context, query], axis=1)
        keep = np.concatenate([keep, np.ones(latents.shape[:2], bool)], axis=1)
    attended, _ = multi_head_attention(query, context, params["attention"], num_heads,
                                       mask=keep[:, None, None, :])
    latents = latents + attended
    hidden = layer_norm(latents, *params["feedforward_norm"], epsilon=epsilon)
    return latents + ffn(hidden, *params["feedforward"], activation=activation)


def perceiver_resampler(inputs, latent_table, layers, output_norm, num_heads,
                        padding_mask=None, attend_to_latents=False, activation=gelu,
                        epsilon=1e-5):
    """`LN_out(U_L)` with `U_0` = the `[r, d]` latent table broadcast over the batch."""
    latents = np.broadcast_to(latent_table[None], (inputs.shape[0],) + latent_table.shape)
    for params in layers:
        latents = resampler_layer(latents, inputs, params, num_heads, padding_mask,
                                  attend_to_latents, activation, epsilon)
    return layer_norm(latents, *output_norm, epsilon=epsilon)
