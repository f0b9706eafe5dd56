"""Lightweight convolution: softmax-normalised kernels shared across channel groups
(Wu et al. 2019; survey §5.5.1)."""

import keras
from keras import ops

from keras_xf.layers.mixers._convolution import HeadConvolution
from keras_xf.ops.convolution import valid_depthwise_convolution


@keras.saving.register_keras_serializable(package="keras_xf")
class LightweightConvolution(HeadConvolution):
    """Lightweight convolution (Wu et al. 2019), a depthwise convolution with `H` shared,
    softmax-normalised kernels (survey §5.5.1, "CNNs as a Replacement for Self-Attention").

        W̃_{h,j} = exp(W_{h,j}) / Σ_{j′} exp(W_{h,j′})
        y_{t,c} = Σ_{j=0}^{K−1} W̃_{⌊c·H/d⌋, j} x_{t−l+j, c}

    Channel `c` uses the kernel of head `⌊c·H/d⌋`, shared by the `d/H` channels of its group
    (`H·K` weights in all). `l = K − 1` when causal, `⌊(K − 1)/2⌋` when centred, `x` zero
    outside the sequence. The softmax runs in float32; during training DropConnect
    (`weight_dropout`) drops normalised weights. With `use_glu=True` the input first goes
    through `GLU(x W^I)` (`W^I`: `d → 2d`) and the convolution's output through `W^O` (`d →
    d`), the block of Wu et al.

    Causal decoding keeps a rolling cache of the last `K − 1` convolution inputs, `[B, K − 1,
    d]` in float32, independent of the context length.

    Args:
        kernel_size: positive int `K`.
        num_heads: positive int `H`, dividing the input width `d`.
        causal: bool, causal (left) padding instead of centred; the default for
            `use_causal_mask`.
        weight_softmax: bool, normalise each kernel by a softmax over its `K` taps.
        weight_dropout: float in [0, 1), DropConnect rate on the normalised kernels.
        use_glu: bool, add the GLU input projection and the output projection.
        use_bias: bool, biases in the projections.
        seed: optional int, seed of the weight dropout.
        kernel_initializer, bias_initializer: initializers of the projections (the kernels
            `W` `[H, K]` start from Glorot-uniform values too).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded positions are zeroed before the convolution
            and in the output.
        attention_mask: must be `None`.
        use_causal_mask: bool, `None` means `causal`.
        cache: `[B, K − 1, d]` from `init_cache` (causal form only).
        cache_index: accepted for the cache protocol (the rolling cache needs no index).
        training: bool, enables the weight dropout.

    Returns:
        `[B, T, d]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> layer = LightweightConvolution(kernel_size=3, num_heads=2, causal=True)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    """

    def build(self, inputs_shape):
        self._build_projections(inputs_shape)
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.num_heads, self.kernel_size),
            initializer=self.kernel_initializer,
        )
        self.built = True

    def channel_kernel(self, training=False):
        """The normalised kernel of each channel, `[K, d]` in float32."""
        weights = self._normalize(self.kernel, training)  # [H, K]
        weights = ops.repeat(weights, self.hidden_dim // self.num_heads, axis=0)  # [d, K]
        return ops.transpose(weights)

    def _convolve(self, padded, signal, training):
        return valid_depthwise_convolution(padded, self.channel_kernel(training))
