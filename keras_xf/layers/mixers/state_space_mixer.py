"""A diagonal state-space sequence mixer, time-invariant (S4D) or selective (survey §5.5.3)."""

import math

import keras
import numpy as np
from keras import ops

from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.scan import METHODS
from keras_xf.ops.scan import linear_recurrence
from keras_xf.ops.scan import prefix_scan
from keras_xf.ops.scan import scan_chunks

INITS = ("s4d_lin", "s4d_inv", "s4d_real")
DISCRETIZATIONS = ("zoh", "bilinear", "euler", "zoh_euler")


def hippo_diagonal(init, state_size):
    """The continuous diagonal state matrix `A_n` (real part, imaginary part) of a HiPPO-based
    initialisation: S4D-Lin `−1/2 + iπn`, S4D-Inv `−1/2 + i (N/π)(N/(2n+1) − 1)`, S4D-Real
    `−(n + 1)`."""
    n = np.arange(state_size, dtype="float64")
    if init == "s4d_lin":
        return np.full(state_size, -0.5), math.pi * n
    if init == "s4d_inv":
        return np.full(state_size, -0.5), state_size / math.pi * (state_size / (2 * n + 1) - 1)
    return -(n + 1), np.zeros(state_size)


def _complex_div(ar, ai, br, bi):
    denominator = br * br + bi * bi
    return (ar * br + ai * bi) / denominator, (ai * br - ar * bi) / denominator


def _complex_mul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


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
        a_bar = _complex_div(1.0 + zr / 2, zi / 2, 1.0 - zr / 2, -zi / 2)
        b_im = ops.zeros_like(b_real) if b_imag is None else b_imag
        b_bar = _complex_div(dt * b_real, dt * b_im, 1.0 - zr / 2, -zi / 2)
        return a_bar, b_bar
    # Zero-order hold.
    a_bar = _zoh_state_matrix(zr, zi)
    if zi is None:
        factor = (a_bar[0] - 1.0) / a_real  # (ΔA)⁻¹(exp(ΔA) − 1)Δ
        return a_bar, (factor * b_real, None if b_imag is None else factor * b_imag)
    factor = _complex_div(a_bar[0] - 1.0, a_bar[1], a_real, a_imag)
    b_im = ops.zeros_like(b_real) if b_imag is None else b_imag
    return a_bar, _complex_mul(factor[0], factor[1], b_real, b_im)


def check_scan_arguments(dt_min, dt_max, method, chunk_size):
    """The step range `0 < dt_min <= dt_max` of the initial `Δ` and the scan (`method`,
    `chunk_size`) of `StateSpaceMixer` and `MambaMixer`."""
    check_positive_number("dt_min", dt_min)
    check_positive_number("dt_max", dt_max)
    if not dt_min <= dt_max:
        raise ValueError(f"Need 0 < dt_min <= dt_max. Received: dt_min={dt_min}, dt_max={dt_max}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
    check_positive_int("chunk_size", chunk_size)


@keras.saving.register_keras_serializable(package="keras_xf")
class StateSpaceMixer(SequenceMixer):
    """A diagonal state-space model per channel as a causal sequence mixer (survey §5.5.3).

    Each of the `d` channels is a single-input single-output system with a diagonal state
    of size `N`:

        dz/dt = z A + s B,   o = z C + s D                                 (continuous)
        z_t = z_{t−1} Ā + s_t B̄,   o_t = Re(z_t C) + s_t D                (discretised)

    `Ā, B̄` come from `A, B` and the learned step `Δt = exp(log_dt)` by zero-order hold,
    the bilinear (Tustin) transform, Euler's method, or Mamba's rule `"zoh_euler"`
    (`Ā = exp(ΔA)` by zero-order hold, `B̄ = ΔB` by Euler; see `discretize`). The outputs `o` go through a
    linear output projection. `A` is complex diagonal, initialised from HiPPO (S4D-Lin
    `A_n = −1/2 + iπn`, S4D-Inv `A_n = −1/2 + i(N/π)(N/(2n+1) − 1)`) or real
    (S4D-Real `A_n = −(n+1)`); a complex `A`, `B`, `C` are held as separate real and
    imaginary weights, and the real part of `A` is kept negative (`−exp(a_log)`), so that
    every discretisation of a small enough step is stable.

    Time-invariant (`selective=False`): training uses the convolution form
    `O = Conv(S, W_ssm) + S D` with the kernel `K_t = Re(C̄ Āᵗ B̄)`, `t = 0 … T−1`,
    applied by FFT. Selective (`selective=True`, Mamba-style): `Δ_t = softplus(s_t W_Δ + b_Δ)`,
    `B_t = s_t W_B` and `C_t = s_t W_C` depend on the token, `A` is real (S4D-Real), and the
    states come from the linear recurrence of `keras_xf.ops.linear_recurrence`. The default
    `method="chunked"` goes one chunk at a time (`keras_xf.ops.scan_chunks`): a chunk's
    `[B, c, d, N]` states are scanned in parallel from the state entering it and read out by
    `C_t` at once, so that no `[B, T, d, N]` tensor is formed (the linear-time form of the
    hardware-aware scan of Mamba). Both decode recurrently: the cache is the state.

    Args:
        state_size: int `N > 0`, the state size per channel.
        init: `"s4d_lin"`, `"s4d_inv"` or `"s4d_real"`; default `"s4d_lin"`, and
            `"s4d_real"` (the only choice) when `selective=True`.
        discretization: `"zoh"`, `"bilinear"`, `"euler"` or `"zoh_euler"` (Mamba's rule).
        selective: bool, input-dependent `Δ`, `B`, `C`.
        dt_min, dt_max: the range of the initial step `Δt` (log-uniform), `0 < dt_min ≤ dt_max`.
        method: the scan of the selective variant: `"chunked"`, `"associative"` or
            `"sequential"`.
        chunk_size: positive int for `method="chunked"`.
        use_bias: bool, bias of the output projection.
        **kwargs: `name`, `dtype`, ….

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded inputs are zeroed so that they do not enter
            the state (the selective variant also holds the state over them), and their
            outputs are zero.
        attention_mask: must be None (a state-space model has no pairwise mask).
        use_causal_mask: accepted for the mixer protocol; the model is causal whatever it is.
        cache: the state from `init_cache` (or a previous call); `cache_index` is accepted
            and not needed (the state holds the whole prefix).
        training: unused.

    Returns:
        `[B, T, d]`, or `(outputs, new_state)` when a cache is given. The state is float32
        (`[B, d, N, 2]` real and imaginary parts for a time-invariant model, `[B, d, N]` for
        the selective one) whatever the dtype policy.

    Example:
    >>> mixer = StateSpaceMixer(state_size=16, discretization="zoh")
    >>> y = mixer(keras.random.normal((2, 10, 32)))
    >>> block = TransformerBlock(mixer=StateSpaceMixer(16), feedforward=FeedForward(64))
    """

    cache_is_recurrent = True
    no_attention_mask = "a state-space model has no pairwise mask; use padding_mask"

    def __init__(
        self,
        state_size=16,
        init=None,
        discretization="zoh",
        selective=False,
        dt_min=1e-3,
        dt_max=1e-1,
        method="chunked",
        chunk_size=64,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("state_size", state_size)
        check_bool("selective", selective)
        if init is None:
            init = "s4d_real" if selective else "s4d_lin"
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}. Received: init={init!r}")
        if selective and init != "s4d_real":
            raise ValueError(
                "The selective state-space model has a real state matrix: init must be "
                f"'s4d_real'. Received: init={init!r}"
            )
        if discretization not in DISCRETIZATIONS:
            raise ValueError(
                f"discretization must be one of {DISCRETIZATIONS}. "
                f"Received: discretization={discretization!r}"
            )
        check_scan_arguments(dt_min, dt_max, method, chunk_size)
        self.state_size = state_size
        self.init = init
        self.discretization = discretization
        self.selective = selective
        self.dt_min = dt_min
        self.dt_max = dt_max
        self.method = method
        self.chunk_size = chunk_size
        self.use_bias = use_bias
        self.complex = init != "s4d_real"
        self.supports_masking = True
        self.width = None

    # Weights -------------------------------------------------------------------------------
    def build(self, inputs_shape):
        self.width = width = self.check_inputs_shape(inputs_shape)
        n = self.state_size
        a_real, a_imag = hippo_diagonal(self.init, n)
        a_log = np.tile(np.log(-a_real), (width, 1))
        self.a_log = self.add_weight(
            name="a_log", shape=(width, n), initializer=keras.initializers.Constant(a_log)
        )
        self.a_imag = None
        if self.complex:
            self.a_imag = self.add_weight(
                name="a_imag", shape=(width, n),
                initializer=keras.initializers.Constant(np.tile(a_imag, (width, 1))),
            )
        log_range = (math.log(self.dt_min), math.log(self.dt_max))
        if self.selective:
            # Δ_t = softplus(s_t W_Δ + b_Δ): b_Δ = softplus⁻¹(Δ₀) with Δ₀ log-uniform.
            self.dt_kernel = self.add_weight(
                name="dt_kernel", shape=(width, width),
                initializer=keras.initializers.RandomNormal(stddev=width**-0.5 * 0.1),
            )
            self.dt_bias = self.add_weight(
                name="dt_bias", shape=(width,), initializer=_inverse_softplus_dt(*log_range)
            )
            self.b_kernel = self.add_weight(
                name="b_kernel", shape=(width, n), initializer="glorot_uniform"
            )
            self.c_kernel = self.add_weight(
                name="c_kernel", shape=(width, n), initializer="glorot_uniform"
            )
        else:
            self.log_dt = self.add_weight(
                name="log_dt", shape=(width,),
                initializer=keras.initializers.RandomUniform(*log_range),
            )
            self.b_real = self.add_weight(name="b_real", shape=(width, n), initializer="ones")
            c_std = 0.5**0.5 if self.complex else 1.0
            self.c_real = self.add_weight(
                name="c_real", shape=(width, n),
                initializer=keras.initializers.RandomNormal(stddev=c_std),
            )
            self.b_imag = self.c_imag = None
            if self.complex:
                self.b_imag = self.add_weight(name="b_imag", shape=(width, n), initializer="zeros")
                self.c_imag = self.add_weight(
                    name="c_imag", shape=(width, n),
                    initializer=keras.initializers.RandomNormal(stddev=c_std),
                )
        self.d = self.add_weight(name="d", shape=(width,), initializer="ones")
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(width, width), initializer="glorot_uniform"
        )
        self.output_bias = None
        if self.use_bias:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(width,), initializer="zeros"
            )
        self.built = True

    def _weight(self, weight):
        return None if weight is None else ops.cast(weight, "float32")

    def _continuous_a(self):
        return -ops.exp(self._weight(self.a_log)), self._weight(self.a_imag)

    # Cache -----------------------------------------------------------------------------
    def init_cache(self, batch_size, max_length=None, dtype=None):
        """The zero state (float32 whatever `dtype`; `max_length` is not needed)."""
        if not self.built:
            raise ValueError("init_cache needs a built StateSpaceMixer: call it once or build it.")
        return ops.zeros(self._cache_shape(batch_size), "float32")

    def _cache_shape(self, batch_size):
        """`[B, d, N]`, or `[B, d, N, 2]` (real and imaginary parts) when time-invariant."""
        shape = (batch_size, self.width, self.state_size)
        return shape if self.selective else shape + (2,)

    # Forward -----------------------------------------------------------------------------
    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
    ):
        self.check_call_inputs(inputs, self.width, padding_mask, attention_mask, cache,
                               self._cache_shape(inputs.shape[0]))
        x = ops.cast(inputs, "float32")
        mask = None
        if padding_mask is not None:
            mask = ops.cast(padding_mask, "float32")[:, :, None]
            x = x * mask
        if self.selective:
            y, state = self._selective(x, mask, cache)
        else:
            y, state = self._time_invariant(x, cache)
        y = y + x * self._weight(self.d)
        outputs = ops.matmul(y, self._weight(self.output_kernel))
        if self.output_bias is not None:
            outputs = outputs + self._weight(self.output_bias)
        if mask is not None:
            outputs = outputs * mask
        outputs = ops.cast(outputs, self.compute_dtype)
        if cache is None:
            return outputs
        return outputs, state

    def _discretized(self):
        a_real, a_imag = self._continuous_a()
        dt = ops.exp(self._weight(self.log_dt))[:, None]
        return discretize(
            self.discretization, dt, a_real, a_imag,
            self._weight(self.b_real), self._weight(self.b_imag),
        )

    def _powers(self, a_bar, exponents):
        """`Āᵗ` for the float exponents `[T]`: `[T, d, N]` (real, imaginary)."""
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

    def _kernel(self, cb_re, cb_im, a_bar, length):
        """`K_t = Re(Σ_n (C B̄)_n Ā_nᵗ)`, `[T, d]`, without forming `[T, d, N]`: with
        `t = i·s + j` (`s = ⌈√T⌉`), `Ā_nᵗ = Ā_nʲ · Ā_n^{i·s}`, so `K` is a product of the
        `[s, d, N]` table `(C B̄)_n Ā_nʲ` and the `[⌈T/s⌉, d, N]` table `Ā_n^{i·s}` summed
        over `n`: a batched matrix product per channel, `O(T·d·N)` multiply-adds and
        `O(√T·d·N)` powers."""
        block = max(1, math.isqrt(length - 1) + 1) if length > 1 else 1
        blocks = -(-length // block)
        low_re, low_im = self._powers(a_bar, ops.cast(ops.arange(block), "float32"))
        high_re, high_im = self._powers(
            a_bar, ops.cast(ops.arange(blocks) * block, "float32")
        )
        if low_im is None:  # a real Ā
            u = cb_re * low_re  # (C B̄)_n Ā_nʲ with C B̄ real as well
            kernel = ops.einsum("jdn,idn->ijd", u, high_re)
        else:
            u_re, u_im = _complex_mul(cb_re, cb_im, low_re, low_im)
            kernel = (ops.einsum("jdn,idn->ijd", u_re, high_re)
                      - ops.einsum("jdn,idn->ijd", u_im, high_im))
        kernel = ops.reshape(kernel, (blocks * block, -1))
        return kernel[:length]

    def _time_invariant(self, x, cache):
        """Convolution with `K_t = Re(Σ_n C_n B̄_n Ā_nᵗ)` by FFT, plus the decayed initial
        state when a cache is given."""
        if x.shape[1] is None:
            raise ValueError(
                "The time-invariant StateSpaceMixer convolves by FFT and needs a static "
                f"sequence length. Received: inputs.shape={x.shape}"
            )
        length = int(x.shape[1])
        a_bar, b_bar = self._discretized()
        c_re, c_im = self._weight(self.c_real), self._weight(self.c_imag)
        if c_im is None:
            c_im = ops.zeros_like(c_re)
        b_re, b_im = b_bar
        if b_im is None:
            b_im = ops.zeros_like(b_re)
        cb_re, cb_im = _complex_mul(c_re, c_im, b_re, b_im)  # C B̄, [d, N]
        y = _causal_fft_convolution(x, self._kernel(cb_re, cb_im, a_bar, length))
        if cache is None:
            return y, None
        steps = ops.cast(ops.arange(length), "float32")
        p_re, p_im = self._powers(a_bar, steps)  # Āᵗ, [T, d, N]
        if p_im is None:
            p_im = ops.zeros_like(p_re)
        # The initial state z₀ contributes Re(Σ_n C_n Āᵗ⁺¹ z₀) to o_t and Āᵀ z₀ to the state.
        h_re, h_im = cache[..., 0], cache[..., 1]  # [B, d, N]
        q_re, q_im = self._powers(a_bar, steps + 1.0)
        if q_im is None:
            q_im = ops.zeros_like(q_re)
        ca_re, ca_im = _complex_mul(c_re[None], c_im[None], q_re, q_im)  # [T, d, N]
        y = y + ops.einsum("tdn,bdn->btd", ca_re, h_re) - ops.einsum("tdn,bdn->btd", ca_im, h_im)
        last_re, last_im = q_re[-1], q_im[-1]  # Āᵀ
        state_re, state_im = _complex_mul(last_re, last_im, h_re, h_im)
        # Σ_i Ā^{T−1−i} B̄ s_i: the powers Āᵗ reversed in time.
        w_re, w_im = _complex_mul(ops.flip(p_re, 0), ops.flip(p_im, 0), b_re[None], b_im[None])
        state_re = state_re + ops.einsum("tdn,btd->bdn", w_re, x)
        state_im = state_im + ops.einsum("tdn,btd->bdn", w_im, x)
        return y, ops.stack([state_re, state_im], axis=-1)

    def _selective(self, x, mask, cache):
        """`z_t = Ā_t z_{t−1} + B̄_t s_t` with `Δ_t`, `B_t`, `C_t` computed from `s_t`."""
        dt = ops.softplus(ops.matmul(x, self._weight(self.dt_kernel)) + self._weight(self.dt_bias))
        b_t = ops.matmul(x, self._weight(self.b_kernel))  # [B, T, N]
        c_t = ops.matmul(x, self._weight(self.c_kernel))
        a_real, _ = self._continuous_a()  # [d, N]
        return selective_scan(
            x, dt, b_t, c_t, a_real, self.discretization, mask=mask, initial_state=cache,
            method=self.method, chunk_size=self.chunk_size,
        )

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, cache=None, **kwargs):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if cache is None:
            return outputs
        return outputs, keras.KerasTensor(cache.shape, dtype=cache.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "state_size": self.state_size,
                "init": self.init,
                "discretization": self.discretization,
                "selective": self.selective,
                "dt_min": self.dt_min,
                "dt_max": self.dt_max,
                "method": self.method,
                "chunk_size": self.chunk_size,
                "use_bias": self.use_bias,
            }
        )
        return config


def _inverse_softplus_dt(log_min, log_max):
    def initializer(shape, dtype=None):
        log_dt = keras.random.uniform(shape, log_min, log_max)
        dt = ops.exp(log_dt)
        return ops.cast(dt + ops.log(-ops.expm1(-dt)), dtype or "float32")  # softplus⁻¹(Δ)

    return initializer


def _causal_fft_convolution(x, kernel):
    """`y_t = Σ_{i≤t} K_{t−i} s_i` per channel, by FFT over `2T` points. x `[B, T, d]`,
    kernel `[T, d]`."""
    length = int(x.shape[1])  # an int also while PyTorch traces (a shape tensor there)
    fft_length = 1 << max(1, (2 * length - 1).bit_length())
    signal = ops.transpose(x, (0, 2, 1))  # [B, d, T]
    filt = ops.transpose(kernel, (1, 0))  # [d, T]
    pad = fft_length - length
    signal = ops.pad(signal, ((0, 0), (0, 0), (0, pad)))
    filt = ops.pad(filt, ((0, 0), (0, pad)))
    s_re, s_im = ops.rfft(signal)
    f_re, f_im = ops.rfft(filt)
    y = ops.irfft(_complex_mul(s_re, s_im, f_re, f_im), fft_length=fft_length)
    return ops.transpose(y[..., :length], (0, 2, 1))


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
