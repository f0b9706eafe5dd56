"""The convolution module of the Conformer (Gulati et al. 2020; survey §5.5.1)."""

import keras
from keras import ops

from keras_xf.layers.mixers._convolution import SequenceConvolution
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_activation
from keras_xf.ops.convolution import glu
from keras_xf.ops.convolution import valid_depthwise_convolution

NORMALIZATIONS = ("batch_norm", "layer_norm")


@keras.saving.register_keras_serializable(package="keras_xf")
class ConformerConvolution(SequenceConvolution):
    """The Conformer convolution module (Gulati et al. 2020) as a sequence mixer (survey
    §5.5.1, CNN layers inside Transformer blocks for local features; §4.1.2):

        u = GLU(x W₁ + b₁)                       pointwise conv d → e·d, GLU → e·d/2
        v_{t,c} = Σ_{j=0}^{K−1} W_{j,c} u_{t−l+j, c} + b_c     depthwise conv, size K
        y = Dropout(Swish(Norm(v)) W₂ + b₂)      norm, activation, pointwise conv → d

    `e` is `expansion` (2 in the paper: the GLU gives back `d` channels), `l = K − 1` when
    causal, `⌊(K − 1)/2⌋` when centred, `u` zero outside the sequence. `Norm` is batch
    normalisation (the paper's) or layer normalisation; batch statistics mix positions and
    sequences during training, so a causal model that must not see the future while
    training should use `"layer_norm"` (at inference batch normalisation uses its moving
    statistics and is per position). Norms run in float32 under mixed precision.

    Causal decoding keeps a rolling cache of the last `K − 1` depthwise-convolution inputs,
    `[B, K − 1, e·d/2]` in float32, independent of the context length.

    Args:
        kernel_size: positive int `K` of the depthwise convolution.
        expansion: positive int `e`; the first pointwise convolution has `e·d` outputs
            (`e·d` must be even: the GLU halves it).
        causal: bool, causal (left) padding instead of centred; the default for
            `use_causal_mask`.
        normalization: `"batch_norm"` or `"layer_norm"`.
        activation: activation after the norm (default `"swish"`).
        dropout: float in [0, 1), dropout on the output.
        use_bias: bool, biases of the pointwise and depthwise convolutions.
        kernel_initializer, bias_initializer: initializers of the convolutions.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded positions are zeroed before the depthwise
            convolution, left out of the batch statistics, and zeroed in the output.
        attention_mask: must be `None`.
        use_causal_mask: bool, `None` means `causal`.
        cache: `[B, K − 1, e·d/2]` from `init_cache` (causal form only).
        cache_index: accepted for the cache protocol (the rolling cache needs no index).
        training: bool (batch statistics, dropout).

    Returns:
        `[B, T, d]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> layer = ConformerConvolution(kernel_size=3, normalization="layer_norm", causal=True)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    """

    def __init__(
        self,
        kernel_size,
        expansion=2,
        causal=False,
        normalization="batch_norm",
        activation="swish",
        dropout=0.0,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(kernel_size, causal=causal, use_bias=use_bias, **kwargs)
        self.expansion = check_positive_int("expansion", expansion)
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}. "
                f"Received: normalization={normalization!r}"
            )
        self.normalization = normalization
        self.activation_fn = get_activation("activation", activation)
        self.activation = activation
        self.dropout = float(check_rate("dropout", dropout))
        self.inner_dim = None

    def build(self, inputs_shape):
        hidden_dim = self.check_inputs_shape(inputs_shape)
        if (self.expansion * hidden_dim) % 2:
            raise ValueError(
                "expansion * hidden_dim must be even (the GLU halves it). Received: "
                f"expansion={self.expansion}, hidden_dim={hidden_dim}"
            )
        self.inner_dim = self.expansion * hidden_dim // 2
        inner_shape = tuple(inputs_shape[:-1]) + (self.inner_dim,)
        self.pointwise_in = self._dense(2 * self.inner_dim, "pointwise_in")
        self.pointwise_in.build(tuple(inputs_shape))
        self.depthwise_kernel = self.add_weight(
            name="depthwise_kernel",
            shape=(self.kernel_size, self.inner_dim),
            initializer=self.kernel_initializer,
        )
        self.depthwise_bias = None
        if self.use_bias:
            self.depthwise_bias = self.add_weight(
                name="depthwise_bias", shape=(self.inner_dim,), initializer=self.bias_initializer
            )
        if self.normalization == "batch_norm":
            self.norm = keras.layers.BatchNormalization(dtype=self.dtype_policy, name="norm")
        else:
            self.norm = keras.layers.LayerNormalization(dtype=self.dtype_policy, name="norm")
        self.norm.build(inner_shape)
        self.pointwise_out = self._dense(hidden_dim, "pointwise_out")
        self.pointwise_out.build(inner_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _channels(self):
        return self.inner_dim

    def _project_in(self, inputs, training):
        return glu(self.pointwise_in(inputs))

    def _convolve(self, padded, signal, training):
        outputs = valid_depthwise_convolution(padded, self.depthwise_kernel)
        if self.depthwise_bias is not None:
            outputs = outputs + ops.cast(self.depthwise_bias, outputs.dtype)
        return outputs

    def _project_out(self, outputs, padding_mask, training):
        if self.normalization == "batch_norm":
            mask = None if padding_mask is None else ops.cast(padding_mask, "bool")
            outputs = self.norm(outputs, training=training, mask=mask)
        else:
            outputs = self.norm(outputs)
        outputs = self.activation_fn(outputs)
        outputs = self.pointwise_out(outputs)
        return self.dropout_layer(outputs, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "expansion": self.expansion,
                "normalization": self.normalization,
                "activation": self.activation if isinstance(self.activation, str)
                else keras.activations.serialize(self.activation),
                "dropout": self.dropout,
            }
        )
        return config
