"""Average attention: the cumulative moving-average memory as a sequence mixer (survey §5.2.2)."""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import get_activation
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class AverageAttention(SequenceMixer):
    """The average attention network (Zhang et al. 2018): every position reads the mean of
    the values before it, through a gate.

    Survey §5.2.2 ("Encoding Long-term Memory"): average pooling reduces the memory of the
    context to one vector, `v̄ = 1/(i−1) Σ_j v_j` (Eq. average-attention-v), updated
    incrementally, `v̄[i] = VMem(v̄[i−1], v_{i−1})`; the moving average is also an instance of
    the linear model `z_i = f(a·z_{i−1} + b·s_i)` of §5.5.2. Here, per position `j`:

        y_k = FFN(x_k) = max(0, x_k W_1 + b_1) W_2 + b_2        (use_ffn; else y_k = x_k)
        g_j = (1/|{k ≤ j valid}|) Σ_{k ≤ j, k valid} y_k        (causal)
        g_j = (1/|{k valid}|) Σ_{k valid} y_k                   (non-causal)
        i_j, f_j = σ([x_j ; g_j] W_g + b_g)                    (use_gate)
        o_j = i_j ⊙ x_j + f_j ⊙ g_j                             (use_gate; else o_j = g_j)

    The values are averaged after the feedforward (the memory holds averaged values, as in
    the survey's `v̄`); Zhang et al. apply the feedforward to the average instead. The sums
    and counts are accumulated in float32 (a cumulative sum for training, the running pair
    `(Σ y, count)` for decoding, both the cache), so decoding token by token equals the full
    causal pass and the state size does not depend on the context length. Padded positions
    enter neither sum nor count and give zero outputs; a position with no valid position
    before it reads `g = 0`.

    Args:
        use_ffn: bool, transform the inputs by a two-layer feedforward before averaging.
        use_gate: bool, the input and forget gates `i, f`; otherwise the output is `g`.
        intermediate_dim: int, hidden width of the feedforward; defaults to the input width.
        activation: activation of the feedforward's hidden layer.
        causal: bool, the default of `use_causal_mask`.
        use_bias: bool, biases of the feedforward and the gate.
        kernel_initializer, bias_initializer: initializers of the feedforward and the gate.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`.
        attention_mask: must be `None` (a running mean has no pairwise mask).
        use_causal_mask: bool, `None` means `causal`.
        cache: `(sum [B, d], count [B])` from `init_cache`, float32; needs the causal form.
        cache_index: accepted for the cache protocol (the count holds the position).
        training: bool.

    Returns:
        `[B, T, d]`, or `(outputs, (sum, count))` when a cache is given.

    Example:
    >>> layer = AverageAttention(intermediate_dim=32)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    >>> state = layer.init_cache(2, 6)
    >>> y0, state = layer(keras.random.normal((2, 1, 16)), cache=state, cache_index=0)
    """

    cache_is_recurrent = True
    no_attention_mask = "a running mean has no pairwise mask; use padding_mask and use_causal_mask"

    def __init__(
        self,
        use_ffn=True,
        use_gate=True,
        intermediate_dim=None,
        activation="relu",
        causal=True,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("use_ffn", use_ffn), ("use_gate", use_gate), ("causal", causal)):
            check_bool(name, value)
        if intermediate_dim is not None:
            if not use_ffn:
                raise ValueError(
                    "intermediate_dim is the feedforward's width and needs use_ffn=True. "
                    f"Received: intermediate_dim={intermediate_dim}, use_ffn=False"
                )
            check_positive_int("intermediate_dim", intermediate_dim)
        self.use_ffn = use_ffn
        self.use_gate = use_gate
        self.intermediate_dim = intermediate_dim
        self.activation = get_activation("activation", activation)
        self.causal = causal
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.supports_masking = True

    def _dense(self, units, name, activation=None):
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        width = self.check_inputs_shape(inputs_shape)
        self.ffn_inner = self.ffn_outer = self.gate_dense = None
        if self.use_ffn:
            hidden = self.intermediate_dim or width
            self.ffn_inner = self._dense(hidden, "ffn_inner", self.activation)
            self.ffn_inner.build(inputs_shape)
            self.ffn_outer = self._dense(width, "ffn_outer")
            self.ffn_outer.build(tuple(inputs_shape[:-1]) + (hidden,))
        if self.use_gate:
            self.gate_dense = self._dense(2 * width, "gate")
            self.gate_dense.build(tuple(inputs_shape[:-1]) + (2 * width,))
        self.built = True

    def cache_shapes(self, batch_size):
        """The empty memory `(Σ y [B, d], count [B])`, float32 whatever `dtype`."""
        return [(batch_size, self.input_dim), (batch_size,)]

    def causal_form(self, use_causal_mask, cache):
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        if cache is not None and not causal:
            raise ValueError(
                "The cache of AverageAttention is the running mean of the causal form; it "
                f"cannot be used non-causally. Received: causal={self.causal}, "
                f"use_causal_mask={use_causal_mask} with a cache"
            )
        return causal

    def mix(self, inputs, padding_mask, causal, cache, training):
        values = inputs
        if self.use_ffn:
            values = self.ffn_outer(self.ffn_inner(inputs))
        values = ops.cast(values, "float32")
        valid = ops.ones(ops.shape(inputs)[:2], "float32")
        if padding_mask is not None:
            valid = ops.cast(padding_mask, "float32")
        values = values * valid[:, :, None]

        new_cache = None
        if causal:
            sums = ops.cumsum(values, axis=1)
            counts = ops.cumsum(valid, axis=1)
            if cache is not None:
                sums = sums + ops.cast(cache[0], "float32")[:, None, :]
                counts = counts + ops.cast(cache[1], "float32")[:, None]
                new_cache = (sums[:, -1], counts[:, -1])
        else:
            sums = ops.sum(values, axis=1, keepdims=True)
            counts = ops.sum(valid, axis=1, keepdims=True)
        average = sums / ops.maximum(counts, 1.0)[:, :, None]
        average = ops.cast(average, self.compute_dtype) * ops.ones_like(inputs)

        outputs = average
        if self.use_gate:
            gates = ops.sigmoid(self.gate_dense(ops.concatenate([inputs, average], axis=-1)))
            input_gate, forget_gate = ops.split(gates, 2, axis=-1)
            outputs = input_gate * inputs + forget_gate * average
        outputs = outputs * ops.cast(valid, outputs.dtype)[:, :, None]
        return outputs, new_cache

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "use_ffn": self.use_ffn,
                "use_gate": self.use_gate,
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "causal": self.causal,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
