"""Numpy oracle for diagonal state-space models (survey §5.5.3): naive recurrences in complex128."""

import numpy as np


def hippo_diagonal(init, state_size):
    n = np.arange(state_size)
    if init == "s4d_lin":
        return -0.5 + 1j * np.pi * n
    if init == "s4d_inv":
        return -0.5 + 1j * state_size / np.pi * (state_size / (2 * n + 1) - 1)
    return -(n + 1.0) + 0j


def discretize(discretization, dt, a, b):
    """`(Ā, B̄)` for a diagonal `A` (complex arrays, elementwise)."""
    if discretization == "euler":
        return 1 + dt * a, dt * b
    if discretization == "zoh_euler":  # Mamba: Ā by zero-order hold, B̄ by Euler
        return np.exp(dt * a), dt * b
    if discretization == "bilinear":
        return (1 + dt * a / 2) / (1 - dt * a / 2), dt * b / (1 - dt * a / 2)
    a_bar = np.exp(dt * a)
    return a_bar, (a_bar - 1) / a * b


def time_invariant(x, a, b, c, d, dt, discretization, initial_state=None):
    """`z_t = z_{t−1} Ā + s_t B̄`, `o_t = Re(z_t C) + s_t D` per channel.

    x `[B, T, d]`; a, b, c `[d, N]` complex; d, dt `[d]`. Returns (o `[B, T, d]`, z_T).
    """
    a_bar, b_bar = discretize(discretization, dt[:, None], a, b)
    batch, length, width = x.shape
    z = np.zeros((batch, width, a.shape[1]), complex) if initial_state is None else initial_state
    outputs = np.zeros((batch, length, width))
    for t in range(length):
        z = z * a_bar + x[:, t, :, None] * b_bar
        outputs[:, t] = np.real(np.sum(z * c, axis=-1)) + x[:, t] * d
    return outputs, z


def selective(x, a, w_dt, b_dt, w_b, w_c, d, discretization, mask=None, initial_state=None):
    """Input-dependent `Δ_t = softplus(s_t W_Δ + b_Δ)`, `B_t = s_t W_B`, `C_t = s_t W_C`;
    `z_t = Ā_t ⊙ z_{t−1} + B̄_t s_t`, `o_t = z_t C_t + s_t D`; padded steps hold the state."""
    batch, length, width = x.shape
    z = np.zeros((batch, width, a.shape[1])) if initial_state is None else initial_state
    outputs = np.zeros((batch, length, width))
    for t in range(length):
        s = x[:, t]
        dt = np.logaddexp(0, s @ w_dt + b_dt)  # softplus
        a_bar, b_bar = discretize(discretization, dt[:, :, None], a[None], np.ones_like(a)[None])
        a_bar, b_bar = np.real(a_bar), np.real(b_bar)
        new = a_bar * z + b_bar * (s @ w_b)[:, None, :] * s[:, :, None]
        if mask is not None:
            new = np.where(mask[:, t, None, None], new, z)
        z = new
        outputs[:, t] = np.sum(z * (s @ w_c)[:, None, :], axis=-1) + s * d
    return outputs, z


def project(y, kernel, bias=None):
    out = y @ kernel
    return out if bias is None else out + bias
