"""Upsampling of a compressed sequence back to its original length (survey §5.8)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.checks import known_width
from keras_xf.ops.masks import zero_padded

METHODS = ("repeat", "transposed")


@keras.saving.register_keras_serializable(package="keras_xf")
class Upsample(keras.layers.Layer):
    """`H = Up(H′) [+ R]`: `[B, n′, d] → [B, n, d]`, the inverse in length of `Downsample`.

    Compressed position `i` gives the `s` positions `i·s … i·s + s − 1`, and the result is cut
    to `n` (`n′ = ⌈n / s⌉`):
    - `"repeat"`: `h_{i·s+j} = h′_i` (no weights);
    - `"transposed"`: a transposed convolution with window and stride `s`,
      `h_{i·s+j} = h′_i U_j + c`, `U ∈ ℝ^{s×d×d}`.
    With a `residual` (the full-length states before downsampling), `H = Up(H′) + R`, the
    Funnel-Transformer decoder's input (Dai et al. 2020), which restores the token-level
    detail that downsampling lost. With a `padding_mask` (the original `[B, n]` mask, which
    is the mask of the outputs), padded positions of the outputs are zero.

    Args:
        stride: int `s ≥ 1`, the factor used to downsample.
        method: `"repeat"` (default) or `"transposed"`.
        use_bias: bool, add `c` (`"transposed"` only).
        kernel_initializer, bias_initializer: initializers of `U` and `c`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, n′, d]`.
        residual: optional `[B, n, d]` added to the upsampled states; gives `n`.
        padding_mask: optional boolean `[B, n]`, the original mask; gives `n`.
        output_length: optional int `n` with `s·(n′ − 1) < n ≤ s·n′`; the default is `n`
            of `residual` or `padding_mask`, else `s·n′`.

    Returns:
        `[B, n, d]`.

    Example:
    >>> layer = Upsample(stride=2, method="transposed")
    >>> y = layer(keras.random.normal((2, 3, 8)), output_length=5)  # (2, 5, 8)
    """

    def __init__(self, stride=2, method="repeat", use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.stride = check_positive_int("stride", stride)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
        self.method = method
        self.use_bias = check_bool("use_bias", use_bias)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.width = None

    def build(self, inputs_shape, residual_shape=None, padding_mask_shape=None):
        self.width = width = known_width(inputs_shape)
        self.kernel = self.bias = None
        if self.method == "transposed":
            self.kernel = self.add_weight(shape=(self.stride, width, width),
                                          initializer=self.kernel_initializer, name="kernel")
            if self.use_bias:
                self.bias = self.add_weight(shape=(width,), initializer=self.bias_initializer,
                                            name="bias")

    def _output_length(self, inputs, residual, padding_mask, output_length):
        check_sequence_width(inputs, self.width)
        if residual is not None:
            check_sequence_width(residual, inputs.shape[-1], name="residual")
        if padding_mask is not None:
            check_rank("padding_mask", padding_mask, 2, "[batch, length]")
            batch, mask_batch = inputs.shape[0], padding_mask.shape[0]
            if isinstance(batch, int) and isinstance(mask_batch, int) and batch != mask_batch:
                raise ValueError(
                    f"padding_mask must have the batch size of inputs ({batch}). Received: "
                    f"padding_mask.shape={tuple(padding_mask.shape)}"
                )
        given = {"residual": residual, "padding_mask": padding_mask}
        lengths = {name: x.shape[1] for name, x in given.items() if x is not None}
        if output_length is not None:
            lengths["output_length"] = check_positive_int("output_length", output_length)
        known = {name: n for name, n in lengths.items() if isinstance(n, int)}
        if len(set(known.values())) > 1:
            raise ValueError(f"residual, padding_mask and output_length must agree on the "
                             f"output length. Received: {known}")
        if residual is not None and padding_mask is not None:
            check_padding_mask(padding_mask, residual, inputs_name="residual")
        length = next(iter(known.values()), None)
        compressed = inputs.shape[1]
        if length is None:
            return None if compressed is None else compressed * self.stride
        if isinstance(compressed, int) and not (
                self.stride * (compressed - 1) < length <= self.stride * compressed):
            name = next(iter(known))
            raise ValueError(
                f"{name} must give a length n with stride·(n′ − 1) < n ≤ stride·n′ for "
                f"n′ = inputs.shape[1] = {compressed}, stride = {self.stride}. Received: "
                f"n = {length}"
            )
        return length

    def call(self, inputs, residual=None, padding_mask=None, output_length=None):
        length = self._output_length(inputs, residual, padding_mask, output_length)
        if self.method == "repeat":
            outputs = ops.repeat(inputs, self.stride, axis=1)
        else:
            batch, compressed = ops.shape(inputs)[0], ops.shape(inputs)[1]
            outputs = ops.einsum("bmd,sde->bmse", inputs, ops.cast(self.kernel, inputs.dtype))
            outputs = ops.reshape(outputs, (batch, compressed * self.stride, self.width))
            if self.bias is not None:
                outputs = outputs + ops.cast(self.bias, outputs.dtype)
        if length is None:
            length = ops.shape(residual if residual is not None else padding_mask)[1]
        outputs = outputs[:, :length]
        if residual is not None:
            outputs = outputs + ops.cast(residual, outputs.dtype)
        if padding_mask is not None:
            outputs = zero_padded(outputs, padding_mask)
        return outputs

    def compute_output_spec(self, inputs, residual=None, padding_mask=None, output_length=None):
        length = self._output_length(inputs, residual, padding_mask, output_length)
        return keras.KerasTensor((inputs.shape[0], length, inputs.shape[2]),
                                 dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update({
            "stride": self.stride,
            "method": self.method,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        })
        return config
