"""Numpy oracle for survey §4.2 (deep models): generalised residuals, DeepNorm, ReZero,
sandwich norms, and Xavier initialisation with depth-dependent gains."""

import numpy as np


def general_residual(f, z, norm, beta, gamma):
    """`z^l = LNorm(F(z^{l-1}) + β·z^{l-1}) + γ·z^{l-1}` (§4.2.1)."""
    return norm(f(z) + beta * z) + gamma * z


def deep_norm_residual(f, z, norm, alpha):
    """DeepNorm: `z^l = LNorm(α·z^{l-1} + F(z^{l-1}))` (Wang et al. 2022)."""
    return norm(alpha * z + f(z))


def sandwich_residual(f, z, norm_in, norm_out):
    """Sandwich norm: `z^l = z^{l-1} + LNorm_out(F(LNorm_in(z^{l-1})))` (Ding et al. 2021)."""
    return z + norm_out(f(norm_in(z)))


def rezero_residual(f, z, alpha):
    """ReZero: `z^l = z^{l-1} + α·F(z^{l-1})` (Bachlechner et al. 2021)."""
    return z + alpha * f(z)


def deep_norm_constants(encoder_layers, decoder_layers):
    """DeepNet's table: `{side: (α, β)}` for the sides with layers (N encoder, M decoder).
    Encoder-only: α = (2N)^¼, β = (8N)^-¼; decoder-only: α = (2M)^¼, β = (8M)^-¼;
    encoder-decoder: encoder α = 0.81 (N⁴M)^(1/16), β = 0.87 (N⁴M)^(-1/16), decoder
    α = (3M)^¼, β = (12M)^-¼."""
    n, m = encoder_layers, decoder_layers
    if m == 0:
        return {"encoder": (np.power(2.0 * n, 0.25), np.power(8.0 * n, -0.25))}
    if n == 0:
        return {"decoder": (np.power(2.0 * m, 0.25), np.power(8.0 * m, -0.25))}
    return {
        "encoder": (0.81 * np.power(n**4 * m, 1 / 16), 0.87 * np.power(n**4 * m, -1 / 16)),
        "decoder": (np.power(3.0 * m, 0.25), np.power(12.0 * m, -0.25)),
    }


def xavier_bound(gain, d_in, d_out):
    """`η = gain · √(6 / (d_in + d_out))`: `W ~ U(−η, η)` (§4.2.2)."""
    return gain * np.sqrt(6.0 / (d_in + d_out))


def xavier_std(gain, d_in, d_out):
    """The standard deviation of a Xavier draw: `η/√3` for both the uniform and the
    (Glorot) normal form, which share the variance `gain² · 2 / (d_in + d_out)`."""
    return xavier_bound(gain, d_in, d_out) / np.sqrt(3.0)


def model_depth_gain(a, b, num_layers):
    """`gain = a · L^b` (§4.2.2)."""
    return a * np.power(float(num_layers), b)


def sub_layer_depth_gain(a, b, depth):
    """`gain = a / l^b` (§4.2.2)."""
    return a / np.power(float(depth), b)
