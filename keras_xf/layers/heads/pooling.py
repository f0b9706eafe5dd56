"""Sequence pooling over the padding mask: first token, mean or max."""

import keras
from keras import ops

from keras_xf.ops.attention import lowest_value
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_rank
from keras_xf.ops.masks import masked_mean

MODES = ("cls", "mean", "max")


@keras.saving.register_keras_serializable(package="keras_xf")
class Pooling(keras.layers.Layer):
    """Reduces `[B, T, d]` to `[B, d]` over the real (unpadded) tokens.

    `"cls"` takes the first token; `"mean"` is `Σ_j m_j h_j / max(1, Σ_j m_j)`; `"max"` is the
    element-wise maximum over real tokens. Reductions run in float32; a fully padded
    sequence gives zeros.

    Args:
        mode: `"cls"`, `"mean"` (default) or `"max"`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: optional boolean `[B, T]`.

    Returns:
        `[B, d]`.

    Example:
    >>> Pooling("mean")(keras.random.normal((2, 5, 8)), padding_mask=np.ones((2, 5), bool))
    """

    def __init__(self, mode="mean", **kwargs):
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Received: mode={mode!r}")
        self.mode = mode

    def build(self, inputs_shape):
        if len(inputs_shape) != 3:
            raise ValueError(
                f"Pooling expects inputs of rank 3. Received: inputs_shape={tuple(inputs_shape)}"
            )

    def call(self, inputs, padding_mask=None):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        check_padding_mask(padding_mask, inputs)
        if self.mode == "cls":
            return inputs[:, 0, :]
        if self.mode == "mean":
            return ops.cast(masked_mean(inputs, padding_mask), self.compute_dtype)
        values = ops.cast(inputs, "float32")
        if padding_mask is None:
            mask = ops.ones_like(values[..., :1])
        else:
            mask = ops.cast(padding_mask, "float32")[..., None]
        masked = ops.where(mask > 0, values, lowest_value("float32"))
        pooled = ops.max(masked, axis=1)
        pooled = ops.where(ops.sum(mask, axis=1) > 0, pooled, 0.0)
        return ops.cast(pooled, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode})
        return config
