"""RMS normalisation whose learned scale is stored as an offset from one (survey §2.4)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_width


@keras.saving.register_keras_serializable(package="keras_xf")
class OffsetRMSNormalization(keras.layers.Layer):
    """`RMSNorm(h) = h / √(mean(h²) + ε) ⊙ (1 + w)`: RMS normalisation (survey §2.4, with the
    mean and shift of layer normalisation dropped) whose scale `α = 1 + w` is held as its
    offset `w` from one, initialised to zeros.

    The function equals Keras' `RMSNormalization` with `scale = 1 + w`; only the variable
    differs. Checkpoints that store the offset (Gemma) load into it unchanged, and weight
    decay pulls the scale towards one rather than zero. The normalisation, the offset and the
    product are computed in float32 and cast back to the compute dtype (the offset variable
    is read in float32 even under mixed precision: `1 + w` in bfloat16 would round `w`).

    Args:
        epsilon: float > 0, added to the mean square inside the square root.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[..., d]`.

    Returns:
        `[..., d]`, in the compute dtype.

    Example:
    >>> norm = OffsetRMSNormalization(epsilon=1e-6)
    >>> y = norm(keras.random.normal((2, 5, 16)))  # (2, 5, 16); w = 0: plain RMS scaling
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        check_positive_number("epsilon", epsilon)
        self.epsilon = float(epsilon)

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(
                "OffsetRMSNormalization needs a known last dimension. Received: "
                f"inputs_shape={inputs_shape}"
            )
        self.scale = self.add_weight(name="scale", shape=(width,), initializer="zeros",
                                     autocast=False)

    def call(self, inputs):
        check_width(inputs, self.scale.shape[0])
        scale = 1.0 + ops.cast(self.scale, "float32")
        outputs = ops.rms_normalization(ops.cast(inputs, "float32"), scale=scale, axis=-1,
                                        epsilon=self.epsilon)
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config
