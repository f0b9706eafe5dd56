"""A diagonal state-space sequence mixer, time-invariant (S4D) or selective (survey §5.5.3)."""

import math

import keras
import numpy as np
from keras import ops

from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.ssm import DISCRETIZATIONS
from keras_xf.ops.ssm import INITS
from keras_xf.ops.ssm import check_scan_arguments
from keras_xf.ops.ssm import discretize
from keras_xf.ops.ssm import hippo_diagonal
from keras_xf.ops.ssm import selective_scan
from keras_xf.ops.ssm import step_bias_initializer
from keras_xf.ops.ssm import time_invariant_ssm


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

    # Weights -------------------------------------------------------------------------------
    def build(self, inputs_shape):
        width = self.check_inputs_shape(inputs_shape)
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
                name="dt_bias", shape=(width,),
                initializer=step_bias_initializer(self.dt_min, self.dt_max),
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

    # Cache and forward -------------------------------------------------------------------
    def cache_shapes(self, batch_size):
        """The state: `[B, d, N]`, or `[B, d, N, 2]` (real and imaginary parts) when
        time-invariant; float32, and its size does not depend on `max_length`."""
        shape = (batch_size, self.input_dim, self.state_size)
        return shape if self.selective else shape + (2,)

    def mix(self, inputs, padding_mask, causal, cache, training):
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
        return ops.cast(outputs, self.compute_dtype), state

    def _discretized(self):
        a_real, a_imag = self._continuous_a()
        dt = ops.exp(self._weight(self.log_dt))[:, None]
        return discretize(
            self.discretization, dt, a_real, a_imag,
            self._weight(self.b_real), self._weight(self.b_imag),
        )

    def _time_invariant(self, x, cache):
        """`Re(z_t C)` by FFT convolution, plus the decayed initial state when a cache is
        given (`keras_xf.ops.ssm.time_invariant_ssm`)."""
        if x.shape[1] is None:
            raise ValueError(
                "The time-invariant StateSpaceMixer convolves by FFT and needs a static "
                f"sequence length. Received: inputs.shape={x.shape}"
            )
        initial = None if cache is None else (cache[..., 0], cache[..., 1])
        c = (self._weight(self.c_real), self._weight(self.c_imag))
        y, state = time_invariant_ssm(x, *self._discretized(), c, initial_state=initial)
        return y, (None if state is None else ops.stack(state, axis=-1))

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

