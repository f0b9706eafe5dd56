"""Sinusoidal absolute position encoding (survey §2.2 and Appendix A)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positions
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rank
from keras_xf.ops.positions import sinusoid_table


@keras.saving.register_keras_serializable(package="keras_xf")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed encoding `PE(j, 2k) = sin(j/b^{2k/d})`, `PE(j, 2k+1) = cos(j/b^{2k/d})`.

    Survey §2.2; Appendix A shows that `PE(i + μ)` is a linear function of `PE(i)`. The layer
    has no weights: it returns the encoding for the positions of `inputs`, broadcast to the
    shape of `inputs`, to be added to the token embeddings (`e_j = x_j + PE(j)`).

    Args:
        base: float, the base `b` (10000 in the original Transformer).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]` embeddings (only the shape is used).
        start_index: int or scalar tensor, position of the first token (for cached decoding).
        positions: optional int tensor `[T]` or `[B, T]` overriding `start_index`.

    Returns:
        `[B, T, d]` encodings in the layer's compute dtype.

    Example:
    >>> x = keras.random.normal((2, 10, 16))
    >>> x = x + SinusoidalPositionEncoding()(x)
    """

    def __init__(self, base=10000.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_number("base", base)
        if base <= 1:
            raise ValueError(f"base must be greater than 1. Received: base={base}")
        self.base = float(base)

    def build(self, inputs_shape):
        if len(inputs_shape) != 3:
            raise ValueError(
                "SinusoidalPositionEncoding expects inputs of rank 3 [batch, length, dim]. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )

    def call(self, inputs, start_index=0, positions=None):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        check_positions(positions, inputs)
        shape = ops.shape(inputs)
        if positions is None:
            positions = ops.arange(shape[1], dtype="int32") + ops.cast(start_index, "int32")
        table = sinusoid_table(positions, inputs.shape[-1], self.base)
        if len(table.shape) == 2:
            table = table[None]
        return ops.broadcast_to(ops.cast(table, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"base": self.base})
        return config
