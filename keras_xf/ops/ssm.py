"""Diagonal state-space maths (survey §5.5.3): the HiPPO initialisations of `A`, the
discretisations of `dz/dt = zA + sB`, the convolution kernel and FFT form of a time-invariant
model, and the selective scan of Mamba.

Each channel is a single-input single-output system with a diagonal state of size `N`; a
complex number is a pair `(real, imaginary)` of real tensors (the imaginary part `None` for a
real system), so that everything runs on `keras.ops` in float32. The layers are
`keras_xf.layers.StateSpaceMixer` and `keras_xf.layers.MambaMixer`.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.convolution import causal_fft_convolution
from keras_xf.ops.scan import METHODS
from keras_xf.ops.scan import linear_recurrence
from keras_xf.ops.scan import prefix_scan
from keras_xf.ops.scan import scan_chunks

INITS = ("s4d_lin", "s4d_inv", "s4d_real")
DISCRETIZATIONS = ("zoh", "bilinear", "euler", "zoh_euler")


def hippo_diagonal(init, state_size):
    """The continuous diagonal state matrix `A_n` (real part, imaginary part) of a HiPPO-based
    initialisation, as float64 numpy arrays `[N]`: S4D-Lin `−1/2 + iπn`, S4D-Inv
    `−1/2 + i (N/π)(N/(2n+1) − 1)`, S4D-Real `−(n + 1)`.

    Example:
    >>> a_real, a_imag = hippo_diagonal("s4d_lin", 4)  # −0.5, and 0, π, 2π, 3π
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}. Received: init={init!r}")
    n = np.arange(state_size, dtype="float64")
    if init == "s4d_lin":
        return np.full(state_size, -0.5), math.pi * n
    if init == "s4d_inv":
        return np.full(state_size, -0.5), state_size / math.pi * (state_size / (2 * n + 1) - 1)
    return -(n + 1), np.zeros(state_size)


def complex_multiply(ar, ai, br, bi):
    """`(a · b)` for `a = ar + i·ai`, `b = br + i·bi`, as a (real, imaginary) pair."""
    return ar * br - ai * bi, ar * bi + ai * br


def complex_divide(ar, ai, br, bi):
    """`(a / b)` for `a = ar + i·ai`, `b = br + i·bi`, as a (real, imaginary) pair."""
    denominator = br * br + bi * bi
    return (ar * br + ai * bi) / denominator, (ai * br - ar * bi) / denominator


def _zoh_state_matrix(zr, zi):
    """`exp(ΔA)` for `ΔA = zr + i·zi` (`zi` None: real), as a (real, imaginary) pair."""
    magnitude = ops.exp(zr)
    if zi is None:
        return magnitude, None
    return magnitude * ops.cos(zi), magnitude * ops.sin(zi)


def discretize(discretization, dt, a_real, a_imag, b_real, b_imag):
    """`(Ā, B̄)` of `dz/dt = zA + sB` with step `Δ`, elementwise for a diagonal `A`, as
    (real, imaginary) pairs; `a_imag`/`b_imag` may be None for real systems.

    Zero-order hold: `Ā = exp(ΔA)`, `B̄ = (ΔA)⁻¹(exp(ΔA) − 1)·ΔB`; bilinear (Tustin):
    `Ā = (1 − ΔA/2)⁻¹(1 + ΔA/2)`, `B̄ = (1 − ΔA/2)⁻¹ΔB`; Euler: `Ā = 1 + ΔA`, `B̄ = ΔB`;
    `"zoh_euler"`, Mamba's rule (survey §5.5.3; Gu & Dao 2023, §2 and §3.5): the state matrix
    by zero-order hold and the input matrix by Euler's method, `Ā = exp(ΔA)`, `B̄ = ΔB` (the
    first-order term of the zero-order hold's `B̄` for a small `ΔA`).

    Example:
    >>> (a_bar, _), (b_bar, _) = discretize("zoh", 0.1, -ops.ones((2,)), None,
    ...                                     ops.ones((2,)), None)  # exp(−0.1), 1 − exp(−0.1)
    """
    zr = dt * a_real
    zi = None if a_imag is None else dt * a_imag
    if discretization in ("euler", "zoh_euler"):
        b_bar = (dt * b_real, None if b_imag is None else dt * b_imag)
        if discretization == "zoh_euler":
            return _zoh_state_matrix(zr, zi), b_bar
        return (1.0 + zr, zi), b_bar
    if discretization == "bilinear":
        if zi is None:
            denominator = 1.0 - zr / 2
            a_bar = ((1.0 + zr / 2) / denominator, None)
            b_bar = (dt * b_real / denominator, None if b_imag is None else dt * b_imag / denominator)
            return a_bar, b_bar
        a_bar = complex_divide(1.0 + zr / 2, zi / 2, 1.0 - zr / 2, -zi / 2)
        b_im = ops.zeros_like(b_real) if b_imag is None else b_imag
        b_bar = complex_divide(dt * b_real, dt * b_im, 1.0 - zr / 2, -zi / 2)
        return a_bar, b_bar
    # Zero-order hold.
    a_bar = _zoh_state_matrix(zr, zi)
    if zi is None:
        factor = (a_bar[0] - 1.0) / a_real  # (ΔA)⁻¹(exp(ΔA) − 1)Δ
        return a_bar, (factor * b_real, None if b_imag is None else factor * b_imag)
    factor = complex_divide(a_bar[0] - 1.0, a_bar[1], a_real, a_imag)
    b_im = ops.zeros_like(b_real) if b_imag is None else b_imag
    return a_bar, complex_multiply(factor[0], factor[1], b_real, b_im)


def diagonal_powers(a_bar, exponents):
    """`Āᵗ` for the float exponents `[T]` of a diagonal `Ā` `[d, N]`: `[T, d, N]` as a
    (real, imaginary) pair, by magnitude and angle (`Ā`'s imaginary part `None`: real, the
    sign of a negative entry following the parity of `t`)."""
    a_re, a_im = a_bar
    t = exponents[:, None, None]
    if a_im is None:
        magnitude = ops.maximum(ops.abs(a_re), 1e-30)
        sign = ops.where(a_re < 0, -1.0, 1.0)
        parity = ops.where(ops.mod(t, 2.0) > 0.5, sign, 1.0)
        return ops.exp(t * ops.log(magnitude)) * parity, None
    magnitude = ops.maximum(ops.sqrt(a_re * a_re + a_im * a_im), 1e-30)
    angle = ops.arctan2(a_im, a_re)
    scale = ops.exp(t * ops.log(magnitude))
    return scale * ops.cos(t * angle), scale * ops.sin(t * angle)


def convolution_kernel(cb_re, cb_im, a_bar, length):
    """The kernel `K_t = Re(Σ_n (C B̄)_n Ā_nᵗ)`, `t = 0 … T−1`, `[T, d]`, of a time-invariant
    diagonal model (survey §5.5.3, the convolution form `O = Conv(S, K)`), without forming
    `[T, d, N]`: with `t = i·s + j` (`s = ⌈√T⌉`), `Ā_nᵗ = Ā_nʲ · Ā_n^{i·s}`, so `K` is a product
    of the `[s, d, N]` table `(C B̄)_n Ā_nʲ` and the `[⌈T/s⌉, d, N]` table `Ā_n^{i·s}` summed
    over `n`: a batched matrix product per channel, `O(T·d·N)` multiply-adds and `O(√T·d·N)`
    powers.

    Args:
        cb_re, cb_im: `C B̄`, `[d, N]` (real and imaginary parts).
        a_bar: `Ā` as a (real, imaginary or None) pair of `[d, N]`.
        length: int `T`.
    """
    block = max(1, math.isqrt(length - 1) + 1) if length > 1 else 1
    blocks = -(-length // block)
    low_re, low_im = diagonal_powers(a_bar, ops.cast(ops.arange(block), "float32"))
    high_re, high_im = diagonal_powers(a_bar, ops.cast(ops.arange(blocks) * block, "float32"))
    if low_im is None:  # a real Ā
        u = cb_re * low_re  # (C B̄)_n Ā_nʲ with C B̄ real as well
        kernel = ops.einsum("jdn,idn->ijd", u, high_re)
    else:
        u_re, u_im = complex_multiply(cb_re, cb_im, low_re, low_im)
        kernel = (ops.einsum("jdn,idn->ijd", u_re, high_re)
                  - ops.einsum("jdn,idn->ijd", u_im, high_im))
    kernel = ops.reshape(kernel, (blocks * block, -1))
    return kernel[:length]


def _or_zeros(imaginary, real):
    return ops.zeros_like(real) if imaginary is None else imaginary


def time_invariant_ssm(x, a_bar, b_bar, c, initial_state=None):
    """`y_t = Re(z_t C)` of `z_t = z_{t−1} Ā + s_t B̄` per channel (survey §5.5.3), as the
    causal convolution with `K_t = Re(Σ_n C_n B̄_n Ā_nᵗ)` by FFT, plus the decayed initial state.

    Args:
        x: inputs `s`, `[B, T, d]` float32 with a static `T`.
        a_bar, b_bar, c: `Ā`, `B̄`, `C`, each a (real, imaginary or None) pair of `[d, N]`.
        initial_state: optional `z_0` as a (real, imaginary) pair of `[B, d, N]`; the final
            state is returned only when it is given (the cache of a decoding call).

    Returns:
        `(y [B, T, d], (z_T real, z_T imaginary) or None)`.
    """
    if x.shape[1] is None:
        raise ValueError(
            "The time-invariant state-space model convolves by FFT and needs a static "
            f"sequence length. Received: inputs.shape={x.shape}"
        )
    length = int(x.shape[1])
    c_re, c_im = c[0], _or_zeros(c[1], c[0])
    b_re, b_im = b_bar[0], _or_zeros(b_bar[1], b_bar[0])
    cb_re, cb_im = complex_multiply(c_re, c_im, b_re, b_im)  # C B̄, [d, N]
    y = causal_fft_convolution(x, convolution_kernel(cb_re, cb_im, a_bar, length))
    if initial_state is None:
        return y, None
    steps = ops.cast(ops.arange(length), "float32")
    p_re, p_im = diagonal_powers(a_bar, steps)  # Āᵗ, [T, d, N]
    p_im = _or_zeros(p_im, p_re)
    # The initial state z₀ contributes Re(Σ_n C_n Āᵗ⁺¹ z₀) to o_t and Āᵀ z₀ to the state.
    h_re, h_im = initial_state  # [B, d, N]
    q_re, q_im = diagonal_powers(a_bar, steps + 1.0)
    q_im = _or_zeros(q_im, q_re)
    ca_re, ca_im = complex_multiply(c_re[None], c_im[None], q_re, q_im)  # [T, d, N]
    y = y + ops.einsum("tdn,bdn->btd", ca_re, h_re) - ops.einsum("tdn,bdn->btd", ca_im, h_im)
    state_re, state_im = complex_multiply(q_re[-1], q_im[-1], h_re, h_im)  # Āᵀ z₀
    # Σ_i Ā^{T−1−i} B̄ s_i: the powers Āᵗ reversed in time.
    w_re, w_im = complex_multiply(ops.flip(p_re, 0), ops.flip(p_im, 0), b_re[None], b_im[None])
    state_re = state_re + ops.einsum("tdn,btd->bdn", w_re, x)
    state_im = state_im + ops.einsum("tdn,btd->bdn", w_im, x)
    return y, (state_re, state_im)


def selective_scan(x, dt, b, c, a, discretization, mask=None, initial_state=None,
                   method="chunked", chunk_size=64):
    """The selective state-space recurrence of Mamba (survey §5.5.3), per channel `e` and
    state entry `n`, in float32:

        z_t = Ā_t ⊙ z_{t−1} + B̄_t s_t,   y_t = Σ_n z_{t,e,n} C_{t,n}

    with `(Ā_t, B̄_t) = discretize(discretization, Δ_t, A, B_t)` elementwise.

    Args:
        x: inputs `s`, `[B, T, E]` float32 (zero at padded steps).
        dt: steps `Δ`, `[B, T, E]` float32 (already positive).
        b, c: the input-dependent `B_t` and `C_t`, `[B, T, N]`.
        a: the real diagonal state matrix `A`, `[E, N]`.
        discretization: one of `DISCRETIZATIONS`.
        mask: optional float `[B, T, 1]`, 0 at padded steps, where the state is held
            (`Ā = 1`; nothing enters since `s_t = 0` there).
        initial_state: optional `z_0`, `[B, E, N]`; the final state is returned only when
            it is given (the cache of a decoding call).
        method: `"chunked"` (one chunk at a time, `keras_xf.ops.scan_chunks`, needs a static
            length), `"associative"` or `"sequential"` (`keras_xf.ops.linear_recurrence`).
        chunk_size: positive int for `"chunked"`.

    Returns:
        `(y [B, T, E], z_T [B, E, N] or None)`.
    """
    if method == "chunked" and x.shape[1] is not None:
        return _selective_by_chunks(x, dt, b, c, a, discretization, mask, initial_state,
                                    chunk_size)
    a_bar, inputs = _selective_terms(x, dt, b, a, discretization, mask)
    states = linear_recurrence(
        a_bar, inputs, initial_state=initial_state, method=method, chunk_size=chunk_size
    )
    y = ops.einsum("btdn,btn->btd", states, c)
    return y, (None if initial_state is None else states[:, -1])


def _selective_terms(x, dt, b, a, discretization, mask):
    """`Ā_t` and `B̄_t s_t`, `[B, T, E, N]`; padded steps hold the state (`Ā = 1`, and
    nothing enters since `s_t = 0` there)."""
    # `expand_dims` rather than `[..., None]`: in TensorFlow's graphs without XLA the
    # gradient of an indexing op fills a zero tensor of its whole input.
    (a_bar, _), (b_bar, _) = discretize(
        discretization, ops.expand_dims(dt, -1), a, None, ops.ones_like(a), None
    )
    inputs = b_bar * ops.expand_dims(b, 2) * ops.expand_dims(x, -1)
    if mask is not None:
        a_bar = ops.where(ops.expand_dims(mask, -1) > 0, a_bar, 1.0)
    return a_bar, inputs


def _selective_by_chunks(x, dt, b, c, a, discretization, mask, initial_state, chunk_size):
    """The chunked scan fused with its read-out, one chunk at a time: the `[B, c, E, N]`
    terms and states of a chunk are built, scanned in parallel from the entering state
    `h` (`z_t = ẑ_t + (Ā_1 ⋯ Ā_t) h`), read out by `C_t` and dropped, so that nothing of
    size `[B, T, E, N]` is formed and the time grows linearly with `T`."""
    valid = ops.ones_like(dt[..., :1]) if mask is None else mask  # [B, T, 1]
    batch = ops.shape(x)[0]
    state = initial_state
    if state is None:
        state = ops.zeros((batch, x.shape[-1], a.shape[-1]))

    def step(state, chunk):
        x_c, dt_c, b_c, c_c, valid_c = chunk
        # The zero padding of the last chunk is marked invalid: the state is held there.
        a_bar, inputs = _selective_terms(x_c, dt_c, b_c, a, discretization, valid_c)
        products, states = prefix_scan(a_bar, inputs)
        states = states + products * ops.expand_dims(state, 1)
        last = ops.squeeze(ops.split(states, [states.shape[1] - 1], axis=1)[1], 1)
        return last, ops.einsum("btdn,btn->btd", states, c_c)

    # A call shorter than a chunk (a decoding step) is one chunk of its own length.
    chunk = min(chunk_size, int(x.shape[1]))
    state, y = scan_chunks(step, state, (x, dt, b, c, valid), chunk)
    return y, (None if initial_state is None else state)


def check_scan_arguments(dt_min, dt_max, method, chunk_size):
    """The step range `0 < dt_min <= dt_max` of the initial `Δ` and the scan (`method`,
    `chunk_size`) of a selective model; a `ValueError` naming the argument otherwise."""
    check_positive_number("dt_min", dt_min)
    check_positive_number("dt_max", dt_max)
    if not dt_min <= dt_max:
        raise ValueError(f"Need 0 < dt_min <= dt_max. Received: dt_min={dt_min}, dt_max={dt_max}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
    check_positive_int("chunk_size", chunk_size)


def step_bias_initializer(dt_min, dt_max):
    """An initializer of the bias `b_Δ` of `Δ_t = softplus(x W_Δ + b_Δ)`: `softplus⁻¹(Δ₀)`
    with `Δ₀` log-uniform in `[dt_min, dt_max]` (Gu & Dao 2023), so that the initial steps
    span that range."""
    log_min, log_max = math.log(dt_min), math.log(dt_max)

    def initializer(shape, dtype=None):
        dt = ops.exp(keras.random.uniform(shape, log_min, log_max))
        return ops.cast(dt + ops.log(-ops.expm1(-dt)), dtype or "float32")  # softplus⁻¹(Δ)

    return initializer
