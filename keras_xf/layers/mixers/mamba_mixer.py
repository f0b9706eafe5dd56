"""The Mamba mixer: a gated, convolved selective state-space model (survey §5.5.3)."""

import math

import keras
import numpy as np
from keras import ops

from keras_xf.layers.mixers.depthwise_convolution import DepthwiseConvolution
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.ssm import check_scan_arguments
from keras_xf.ops.ssm import selective_scan
from keras_xf.ops.ssm import step_bias_initializer

# Mamba's discretisation: Ā = exp(ΔA) by zero-order hold, B̄ = ΔB by Euler.
DISCRETIZATION = "zoh_euler"


@keras.saving.register_keras_serializable(package="keras_xf")
class MambaMixer(SequenceMixer):
    """The Mamba block's mixer (Gu & Dao 2023; survey §5.5.3): an input projection, a causal
    depthwise convolution, a selective state-space model with a skip term, a SiLU gate and an
    output projection. With `E = expand · d` inner channels and a state of size `N` each:

        [x, z] = h W_in (+ b_in)                                  x, z ∈ R^E
        x ← SiLU(CausalDepthwiseConv_K(x))
        [δ, B_t, C_t] = x W_x                                     δ ∈ R^R, B_t, C_t ∈ R^N
        Δ_t = softplus(δ W_Δ + b_Δ)                               Δ_t ∈ R^E (rank R)
        A = −exp(A_log)                                           A ∈ R^{E×N}
        s_{t,e} = exp(Δ_{t,e} A_e) ⊙ s_{t−1,e} + Δ_{t,e} B_t x_{t,e}   (Ā by zero-order hold,
                                                                     B̄ by Euler: "zoh_euler")
        y_{t,e} = s_{t,e} · C_t + D_e x_{t,e}
        o = (y ⊙ SiLU(z)) W_out (+ b_out)

    The convolution is a `DepthwiseConvolution(K, causal=True)` and the recurrence is
    `keras_xf.ops.ssm.selective_scan` (chunked by default: no `[B, T, E, N]` tensor is
    formed). The selection, the step `Δ`, `A`, the scan and the gate are computed in float32;
    the projections and the convolution in the compute dtype.

    Args:
        state_size: int `N > 0`, the state size per inner channel.
        expand: int `> 0`, inner channels `E = expand · d`.
        conv_kernel: int `K > 0`, the width of the causal convolution.
        dt_rank: int `R > 0` or `"auto"` (`⌈d / 16⌉`), the rank of the step projection.
        use_bias: bool, biases of the input and output projections.
        use_conv_bias: bool, a bias of the convolution.
        dt_min, dt_max: the range of the initial step `Δ` (log-uniform, through `b_Δ`),
            `0 < dt_min ≤ dt_max`.
        method: the scan: `"chunked"`, `"associative"` or `"sequential"`.
        chunk_size: positive int for `method="chunked"`.
        **kwargs: `name`, `dtype`, ….

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded positions are zeroed before the convolution,
            the state is held over them (nothing of theirs enters it), and their outputs are
            zero. With a cache, the convolution's window ends at each row's last valid token,
            so right padding never enters the cache.
        attention_mask: must be None (the model has no pairwise mask).
        use_causal_mask: accepted for the mixer protocol; the layer is causal whatever it is.
        cache: `(convolution window [B, K − 1, E], state [B, E, N])` from `init_cache` (or a
            previous call), float32; `cache_index` is accepted and not needed.
        training: unused.

    Returns:
        `[B, T, d]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> mixer = MambaMixer(state_size=8, expand=2, conv_kernel=4)
    >>> y = mixer(keras.random.normal((2, 6, 16)))
    >>> cache = mixer.init_cache(2)
    >>> y0, cache = mixer(keras.random.normal((2, 1, 16)), cache=cache, cache_index=0)
    >>> block = TransformerBlock(MambaMixer(16), None, normalization="rms_norm",
    ...                          norm_placement="pre")
    """

    cache_is_recurrent = True
    no_attention_mask = "a state-space model has no pairwise mask; use padding_mask"

    def __init__(
        self,
        state_size=16,
        expand=2,
        conv_kernel=4,
        dt_rank="auto",
        use_bias=False,
        use_conv_bias=True,
        dt_min=1e-3,
        dt_max=1e-1,
        method="chunked",
        chunk_size=64,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("state_size", state_size)
        check_positive_int("expand", expand)
        check_positive_int("conv_kernel", conv_kernel)
        if dt_rank != "auto":
            check_positive_int("dt_rank", dt_rank)
        check_bool("use_bias", use_bias)
        check_bool("use_conv_bias", use_conv_bias)
        check_scan_arguments(dt_min, dt_max, method, chunk_size)
        self.state_size = state_size
        self.expand = expand
        self.conv_kernel = conv_kernel
        self.dt_rank = dt_rank
        self.use_bias = use_bias
        self.use_conv_bias = use_conv_bias
        self.dt_min = dt_min
        self.dt_max = dt_max
        self.method = method
        self.chunk_size = chunk_size
        self.supports_masking = True
        self.inner_dim = self.rank = None

    # Weights -------------------------------------------------------------------------------
    def build(self, inputs_shape):
        width = self.check_inputs_shape(inputs_shape)
        inner = self.inner_dim = self.expand * width
        rank = self.rank = math.ceil(width / 16) if self.dt_rank == "auto" else self.dt_rank
        n = self.state_size
        policy = self.dtype_policy
        self.input_projection = keras.layers.Dense(
            2 * inner, use_bias=self.use_bias, dtype=policy, name="input_projection"
        )
        self.input_projection.build((None, None, width))
        self.convolution = DepthwiseConvolution(
            self.conv_kernel, causal=True, use_bias=self.use_conv_bias, dtype=policy,
            name="convolution",
        )
        self.convolution.build((None, None, inner))
        # x W_x = [δ, B_t, C_t]: the low-rank step input and the selective B and C.
        self.selection_kernel = self.add_weight(
            name="selection_kernel", shape=(inner, rank + 2 * n), initializer="glorot_uniform"
        )
        # Δ_t = softplus(δ W_Δ + b_Δ): b_Δ = softplus⁻¹(Δ₀) with Δ₀ log-uniform.
        self.dt_kernel = self.add_weight(
            name="dt_kernel", shape=(rank, inner),
            initializer=keras.initializers.RandomUniform(-(rank**-0.5), rank**-0.5),
        )
        self.dt_bias = self.add_weight(
            name="dt_bias", shape=(inner,),
            initializer=step_bias_initializer(self.dt_min, self.dt_max),
        )
        # S4D-Real: A_n = −(n + 1) in every channel.
        a_log = np.tile(np.log(np.arange(1, n + 1, dtype="float64")), (inner, 1))
        self.a_log = self.add_weight(
            name="a_log", shape=(inner, n), initializer=keras.initializers.Constant(a_log)
        )
        self.d = self.add_weight(name="d", shape=(inner,), initializer="ones")
        self.output_projection = keras.layers.Dense(
            width, use_bias=self.use_bias, dtype=policy, name="output_projection"
        )
        self.output_projection.build((None, None, inner))
        self.built = True

    def _weight(self, weight):
        return ops.cast(weight, "float32")

    # Cache and forward -------------------------------------------------------------------
    def cache_shapes(self, batch_size):
        """`(convolution window [B, K − 1, E], state [B, E, N])`, float32; neither depends on
        `max_length`."""
        return ((batch_size, self.conv_kernel - 1, self.inner_dim),
                (batch_size, self.inner_dim, self.state_size))

    def mix(self, inputs, padding_mask, causal, cache, training):
        x, z = ops.split(self.input_projection(inputs), 2, axis=-1)
        if cache is None:
            x = self.convolution(x, padding_mask=padding_mask)
        else:
            x, window = self.convolution(x, padding_mask=padding_mask, cache=cache[0])
        # The convolution zeroes padded positions, and SiLU(0) = 0: nothing enters there.
        x = ops.silu(ops.cast(x, "float32"))
        mask = None
        if padding_mask is not None:
            mask = ops.cast(padding_mask, "float32")[:, :, None]
        rank, n = self.rank, self.state_size
        delta, b_t, c_t = ops.split(
            ops.matmul(x, self._weight(self.selection_kernel)), [rank, rank + n], axis=-1
        )
        dt = ops.softplus(ops.matmul(delta, self._weight(self.dt_kernel))
                          + self._weight(self.dt_bias))
        a = -ops.exp(self._weight(self.a_log))
        y, state = selective_scan(
            x, dt, b_t, c_t, a, DISCRETIZATION, mask=mask,
            initial_state=None if cache is None else cache[1], method=self.method,
            chunk_size=self.chunk_size,
        )
        y = (y + x * self._weight(self.d)) * ops.silu(ops.cast(z, "float32"))
        outputs = self.output_projection(ops.cast(y, self.compute_dtype))
        if mask is not None:
            outputs = outputs * ops.cast(mask, outputs.dtype)
        return outputs, (None if cache is None else (window, state))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "state_size": self.state_size,
                "expand": self.expand,
                "conv_kernel": self.conv_kernel,
                "dt_rank": self.dt_rank,
                "use_bias": self.use_bias,
                "use_conv_bias": self.use_conv_bias,
                "dt_min": self.dt_min,
                "dt_max": self.dt_max,
                "method": self.method,
                "chunk_size": self.chunk_size,
            }
        )
        return config
