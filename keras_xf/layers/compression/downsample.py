"""Strided-convolution downsampling of a sequence (survey §5.8, "Sequence Compression")."""

import keras
from keras import ops

from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.checks import known_width
from keras_xf.ops.masks import compressed_length
from keras_xf.ops.masks import downsample_padding_mask
from keras_xf.ops.masks import zero_padded


@keras.saving.register_keras_serializable(package="keras_xf")
class Downsample(keras.layers.Layer):
    """`H′ = Conv(H, W, k, s)`: a sequence of `n` vectors in `ℝ^d` compressed to `⌈n / s⌉`.

    Survey §5.8: "a filter with a width of 2 and a stride of 2 … produces a sequence of `m/2`
    new vectors", a reduction factor `s`. Window `i` reads positions `i·s … i·s + k − 1`,
    `h′_i = b + Σ_{j<k} h_{i·s+j} W_j` with `W ∈ ℝ^{k×d×d}`; the sequence is right-padded with
    zeros to `(⌈n/s⌉ − 1)·s + k` positions, so `n′ = ⌈n / s⌉` is a static function of `n`
    (it compiles under XLA). `kernel_size ≥ stride`, so every position is read.

    Padding: padded positions are zeroed before the convolution, so they never reach a real
    output. A compressed position is real when any of the positions its window covers is real
    (`downsample_padding_mask`); the outputs at compressed positions that are not real are
    zero. Stacking several layers gives progressive downsampling.

    Args:
        stride: int `s ≥ 1`, the reduction factor.
        kernel_size: int `k ≥ s`, the window; `None` means `k = s` (non-overlapping windows).
        use_bias: bool, add `b`.
        kernel_initializer, bias_initializer: initializers of `W` and `b`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, n, d]`.
        padding_mask: optional boolean `[B, n]`, true at real tokens.

    Returns:
        `[B, ⌈n/s⌉, d]`; with a `padding_mask`, the tuple `(outputs, compressed_mask)`, the
        mask boolean `[B, ⌈n/s⌉]`.

    Example:
    >>> layer = Downsample(stride=2, kernel_size=3)
    >>> y = layer(keras.random.normal((2, 5, 8)))  # (2, 3, 8)
    """

    def __init__(self, stride=2, kernel_size=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.stride = check_positive_int("stride", stride)
        if kernel_size is None:
            kernel_size = self.stride
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        if self.kernel_size < self.stride:
            raise ValueError(
                "kernel_size must be at least stride, so that every position is read. "
                f"Received: kernel_size={kernel_size}, stride={stride}"
            )
        self.use_bias = check_bool("use_bias", use_bias)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.width = None

    def build(self, inputs_shape, padding_mask_shape=None):
        self.width = width = known_width(inputs_shape)
        self.kernel = self.add_weight(shape=(self.kernel_size, width, width),
                                      initializer=self.kernel_initializer, name="kernel")
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(shape=(width,), initializer=self.bias_initializer,
                                        name="bias")

    def call(self, inputs, padding_mask=None):
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        length = inputs.shape[1] if isinstance(inputs.shape[1], int) else ops.shape(inputs)[1]
        if padding_mask is not None:
            inputs = zero_padded(inputs, padding_mask)
        extra = (compressed_length(length, self.stride) - 1) * self.stride + self.kernel_size
        padded = ops.pad(inputs, ((0, 0), (0, extra - length), (0, 0)))
        outputs = ops.conv(padded, ops.cast(self.kernel, inputs.dtype), strides=self.stride,
                           padding="valid")
        if self.bias is not None:
            outputs = outputs + ops.cast(self.bias, outputs.dtype)
        if padding_mask is None:
            return outputs
        mask = downsample_padding_mask(padding_mask, self.kernel_size, self.stride)
        return zero_padded(outputs, mask), mask

    def compute_output_spec(self, inputs, padding_mask=None):
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        length = inputs.shape[1]
        length = compressed_length(length, self.stride) if isinstance(length, int) else None
        outputs = keras.KerasTensor((inputs.shape[0], length, inputs.shape[2]),
                                    dtype=self.compute_dtype)
        if padding_mask is None:
            return outputs
        return outputs, keras.KerasTensor((inputs.shape[0], length), dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update({
            "stride": self.stride,
            "kernel_size": self.kernel_size,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        })
        return config
