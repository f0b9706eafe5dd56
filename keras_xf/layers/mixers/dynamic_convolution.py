"""Dynamic convolution: kernels predicted from each position (Wu et al. 2019; survey §5.5.1)."""

import keras
from keras import ops

from keras_xf.layers.mixers._convolution import HeadConvolution

# Positions per block of the tap sum on long sequences: one block's copies and products
# (2,048 × d floats each) stay in a CPU's caches, where one block of the whole sequence does not.
POSITION_BLOCK = 2048


@keras.saving.register_keras_serializable(package="keras_xf")
class DynamicConvolution(HeadConvolution):
    """Dynamic convolution (Wu et al. 2019): a lightweight convolution whose `H` kernels are
    predicted at every position from the current input (survey §5.5.1).

        W̃_t = softmax_K(reshape_{H×K}(x_t W^K + b^K))                      [H, K] per t
        y_{t,c} = Σ_{j=0}^{K−1} W̃_{t, ⌊c·H/d⌋, j} x_{t−l+j, c}

    `l = K − 1` when causal, `⌊(K − 1)/2⌋` when centred, `x` zero outside the sequence. The
    kernels, `[B, T, H, K]`, are normalised in float32 (DropConnect with `weight_dropout`
    during training) and applied as a sum over the `K` shifted copies of the sequence, one
    `[B, T, d]` product per tap (they are not stacked into `[B, T, K, d]`): memory `O(T·d)`
    besides the kernels' `O(T·H·K)`, linear in `T` (self-attention's weights are `O(T²)`).
    A sequence of known length over 2,048 positions is summed one block of 2,048 positions at
    a time, which keeps each block's products in cache; the result is the same.
    With `use_glu=True` the input first goes through `GLU(x W^I)` (`d → 2d`; the kernels are
    predicted from its output) and the result through `W^O` (`d → d`).

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
        use_bias: bool, biases in the kernel predictor and the projections.
        seed: optional int, seed of the weight dropout.
        kernel_initializer, bias_initializer: initializers of the dense layers.
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
    >>> layer = DynamicConvolution(kernel_size=4, num_heads=2, causal=True, use_glu=True)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    """

    def build(self, inputs_shape):
        hidden_dim = self._build_projections(inputs_shape)
        self.kernel_dense = self._dense(self.num_heads * self.kernel_size, "kernel_dense")
        self.kernel_dense.build(tuple(inputs_shape[:-1]) + (hidden_dim,))
        self.built = True

    def position_kernels(self, signal, training=False):
        """The normalised kernels `[B, T, H, K]` (float32) predicted from `signal`."""
        logits = self.kernel_dense(signal)
        batch, length = ops.shape(signal)[0], ops.shape(signal)[1]
        logits = ops.reshape(logits, (batch, length, self.num_heads, self.kernel_size))
        return self._normalize(logits, training)

    def _convolve(self, padded, signal, training):
        kernels = ops.cast(self.position_kernels(signal, training), signal.dtype)
        batch, length = ops.shape(signal)[0], ops.shape(signal)[1]
        group = self.hidden_dim // self.num_heads
        shifted = ops.reshape(padded, (batch, -1, self.num_heads, group))
        if not isinstance(length, int) or length <= POSITION_BLOCK:
            outputs = self._tap_sum(shifted, kernels, length)
        else:  # a static length: one block of positions at a time
            blocks = []
            for start in range(0, length, POSITION_BLOCK):
                size = min(POSITION_BLOCK, length - start)
                blocks.append(self._tap_sum(
                    shifted[:, start:start + size + self.kernel_size - 1],
                    kernels[:, start:start + size], size))
            outputs = ops.concatenate(blocks, axis=1)
        return ops.reshape(outputs, (batch, length, self.hidden_dim))

    def _tap_sum(self, shifted, kernels, length):
        """`Σ_j W̃_{t,h,j} x_{t+j}` for `shifted` `[B, length + K − 1, H, d/H]` and `kernels`
        `[B, length, H, K]`: tap `j` reads the copy shifted by `j`, one `[B, T, d]` product each."""
        outputs = 0.0
        for j in range(self.kernel_size):
            window = shifted[:, j:j + length]
            outputs = outputs + window * kernels[:, :, :, j:j + 1]
        return outputs
