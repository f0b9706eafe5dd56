"""Depthwise convolution as a sequence mixer (survey §5.5.1)."""

import keras

from keras_xf.layers.mixers._convolution import SequenceConvolution
from keras_xf.ops.convolution import valid_depthwise_convolution


@keras.saving.register_keras_serializable(package="keras_xf")
class DepthwiseConvolution(SequenceConvolution):
    """Depthwise convolution: one size-`K` filter per channel (survey §5.5.1, "CNNs as a
    Replacement for Self-Attention"; §4.1.2 for the local view).

    Each of the `d` channels is convolved independently with its own filter, `d·K` weights
    instead of the `d²·K` of a full convolution:

        y_{t,c} = Σ_{j=0}^{K−1} W_{j,c} x_{t−l+j, c} + b_c

    with `x` zero outside the sequence and `l = K − 1` when causal (the output at `t` reads
    `x_{t−K+1} … x_t`) or `l = ⌊(K − 1)/2⌋` when centred (for an even `K` the window reaches
    one position further right than left). Linear in the sequence length.

    Causal decoding keeps a rolling cache of the last `K − 1` inputs, `[B, K − 1, d]` in
    float32, independent of the context length.

    Args:
        kernel_size: positive int `K`.
        causal: bool, causal (left) padding instead of centred; the default for
            `use_causal_mask`.
        use_bias: bool, add a bias per channel.
        kernel_initializer, bias_initializer: initializers of `W` `[K, d]` and `b` `[d]`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded positions are zeroed before the convolution
            (they never reach valid ones) and in the output; with a cache, the new cache
            ends at each row's last valid token (right padding never enters it).
        attention_mask: must be `None`.
        use_causal_mask: bool, `None` means `causal`.
        cache: `[B, K − 1, d]` from `init_cache` (causal form only): the preceding inputs.
        cache_index: accepted for the cache protocol (the rolling cache needs no index).
        training: bool.

    Returns:
        `[B, T, d]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> layer = DepthwiseConvolution(kernel_size=3, causal=True)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    >>> cache = layer.init_cache(2, 6)
    >>> y0, cache = layer(keras.random.normal((2, 1, 16)), cache=cache, cache_index=0)
    """

    def build(self, inputs_shape):
        hidden_dim = self.check_inputs_shape(inputs_shape)
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.kernel_size, hidden_dim),
            initializer=self.kernel_initializer,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(hidden_dim,), initializer=self.bias_initializer
            )
        self.built = True

    def _channels(self):
        return int(self.kernel.shape[-1])

    def _convolve(self, padded, signal, training):
        outputs = valid_depthwise_convolution(padded, self.kernel)
        if self.bias is not None:
            outputs = outputs + keras.ops.cast(self.bias, outputs.dtype)
        return outputs
