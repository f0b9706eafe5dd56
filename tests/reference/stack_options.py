"""Numpy oracle for the depth options of a stack: layer fusion (survey §4.2.3), layer drop
with its inference rescaling (§4.2.4), linear multi-step residuals (§4.3).

A layer is given as a function `block(z)` (the block's own maths is checked elsewhere);
these references compose the layers as the survey's equations say."""

import numpy as np

from tests.reference import layers as ref

# Adams–Bashforth: z_l = z_{l−1} + h Σ_i b_i f_{l−i}, the b_i for orders 1–4.
ADAMS_BASHFORTH_B = {
    1: [1.0],
    2: [1.5, -0.5],
    3: [23.0 / 12.0, -4.0 / 3.0, 5.0 / 12.0],
    4: [55.0 / 24.0, -59.0 / 24.0, 37.0 / 24.0, -3.0 / 8.0],
}


def average(zs):
    """`φ = (1/n) Σ_k z^k` (table of fusion functions, average pooling)."""
    return sum(zs) / len(zs)


def weighted_sum(zs, weights):
    """`φ = Σ_k weight_k · z^k`."""
    return sum(w * z for w, z in zip(weights, zs))


def feedforward(zs, ffn_weights):
    """`φ = FFN([z^1, …, z^n])`, the FFN over the concatenated features."""
    return ref.ffn(np.concatenate(zs, axis=-1), *ffn_weights)


def attention(zs, wq, wk, wv, ffn_weights):
    """`φ = FFN([Att_self(z^1, …, z^n)])`: at each position, one-head self-attention over the
    `n` layer outputs, the attended vectors concatenated, then the FFN."""
    layers = np.stack(zs, axis=-2)  # [B, T, n, d]
    q, k, v = layers @ wq, layers @ wk, layers @ wv
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(layers.shape[-1])
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    alpha = scores / scores.sum(axis=-1, keepdims=True)
    attended = alpha @ v
    return feedforward([attended[..., i, :] for i in range(len(zs))], ffn_weights)


def fused_stack(x, blocks, fusions):
    """`Z^1 = z^0 = x`, `z^l = Layer^l(Z^l)`, `Z^{l+1} = φ_l(z^0, …, z^l)`; the stack's output
    is `Z^{L+1}` (`fusions[l]` fuses `l + 2` outputs)."""
    states = [x]
    inputs = x
    for index, block in enumerate(blocks):
        states.append(block(inputs))
        inputs = fusions[index](states)
    return inputs


def layer_drop_stack(x, blocks, scales):
    """`z^l = z^{l−1} + s_l · (Layer^l(z^{l−1}) − z^{l−1})`: `s_l ∈ {0, 1}` a training gate
    (0 skips the layer), `s_l = ρ` the survey's inference rescaling
    `z^l = ρ · LNorm(F^l(z^{l−1})) + z^{l−1}` of a pre-norm layer."""
    z = x
    for block, scale in zip(blocks, scales):
        z = z + scale * (block(z) - z)
    return z


def multistep_stack(x, blocks, coefficients):
    """`z^l = Σ_i a_i · z^{l−i} + Σ_i b_i · f^{l−i+1}`, with `f^j = Layer^j(z^{j−1}) − z^{j−1}`
    (survey §4.3, eq. of linear multi-step methods with h = 1); `coefficients[l] = (a, b)`."""
    states, increments = [x], []
    for block, (a, b) in zip(blocks, coefficients):
        increments.insert(0, block(states[-1]) - states[-1])
        newest_first = states[::-1]
        z = sum(a_i * newest_first[i] for i, a_i in enumerate(a))
        z = z + sum(b_i * increments[i] for i, b_i in enumerate(b))
        states.append(z)
    return states[-1]
