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


def _silu(x):
    return x / (1 + np.exp(-x))


def mamba(h, w, rank, mask=None, window=None, state=None):
    """The Mamba mixer from its equations (Gu & Dao 2023; survey §5.5.3), float64, one step
    at a time: `[x, z] = h W_in + b_in`; `x ← SiLU(causal depthwise conv(x) + b_conv)`;
    `[δ, B_t, C_t] = x W_x`; `Δ = softplus(δ W_Δ + b_Δ)`; `A = −exp(A_log)`;
    `s_t = exp(Δ_t A) ⊙ s_{t−1} + Δ_t B_t x_t` (Ā by zero-order hold, B̄ by Euler);
    `y_t = s_t C_t + D x_t`; `o = (y ⊙ SiLU(z)) W_out + b_out`.

    `w` maps the names `in_kernel [d, 2E]`, `in_bias`, `conv_kernel [K, E]`, `conv_bias`,
    `selection_kernel [E, R + 2N]`, `dt_kernel [R, E]`, `dt_bias`, `a_log [E, N]`, `d [E]`,
    `out_kernel [E, d]`, `out_bias` (biases may be None). Padded steps (`mask` false) enter
    neither the convolution nor the state, and their outputs are zero. `window` `[B, K − 1, E]`
    and `state` `[B, E, N]` are the preceding inputs of the convolution and the state.
    Returns `(outputs, last window of valid inputs, final state)`.
    """
    bias = lambda name: 0.0 if w.get(name) is None else w[name]  # noqa: E731
    batch, length, _ = h.shape
    kernel = w["conv_kernel"]
    size, inner = kernel.shape
    n = w["a_log"].shape[1]
    mask = np.ones((batch, length), bool) if mask is None else mask.astype(bool)
    xz = h @ w["in_kernel"] + bias("in_bias")
    x, z = xz[..., :inner], xz[..., inner:]
    x = np.where(mask[..., None], x, 0.0)
    history = np.zeros((batch, size - 1, inner)) if window is None else np.array(window)
    s = np.zeros((batch, inner, n)) if state is None else np.array(state)
    a = -np.exp(w["a_log"])
    outputs = np.zeros(h.shape)
    for t in range(length):
        taps = np.concatenate([history, x[:, t:t + 1]], axis=1)  # [B, K, E]
        u = _silu(np.einsum("bke,ke->be", taps, kernel) + bias("conv_bias"))
        selection = u @ w["selection_kernel"]
        delta, b_t, c_t = selection[:, :rank], selection[:, rank:rank + n], selection[:, rank + n:]
        dt = np.logaddexp(0, delta @ w["dt_kernel"] + w["dt_bias"])  # softplus, [B, E]
        a_bar, b_bar = discretize("zoh_euler", dt[..., None], a[None], np.ones_like(a)[None])
        new = np.real(a_bar) * s + np.real(b_bar) * b_t[:, None, :] * u[..., None]
        valid = mask[:, t]
        s = np.where(valid[:, None, None], new, s)
        history = np.where(valid[:, None, None], taps[:, 1:], history)
        y = np.einsum("ben,bn->be", s, c_t) + w["d"] * u
        o = (y * _silu(z[:, t])) @ w["out_kernel"] + bias("out_bias")
        outputs[:, t] = np.where(valid[:, None], o, 0.0)
    return outputs, history, s
