"""Xavier initialisation with a gain that shrinks with a sub-layer's depth (survey §4.2.2)."""

import keras

from keras_xf.initializers.xavier import Xavier
from keras_xf.ops.checks import check_finite_number
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number


@keras.saving.register_keras_serializable(package="keras_xf")
class SubLayerDepthXavier(Xavier):
    """Xavier with `gain = a / l^b` for the sub-layer at depth `l` (survey §4.2.2, eq.
    `gain = a/l^b`; depth-scaled initialisation, Zhang et al. 2019, is `b = 1/2`):
    `η = a / l^b · √(6 / (d_in + d_out))`. Sub-layers nearer the output (larger `l`)
    start with smaller weights.

    Args:
        depth: int `l ≥ 1`, the sub-layer's depth counted from the input.
        a: positive float.
        b: float exponent.
        distribution, seed, input_axes, output_axes: as `Xavier`.

    Example:
    >>> initializer = SubLayerDepthXavier(depth=3, a=1.0, b=0.5)
    >>> dense = keras.layers.Dense(16, kernel_initializer=initializer)
    """

    def __init__(self, depth, a=1.0, b=0.0, distribution="uniform", seed=None,
                 input_axes=None, output_axes=None):
        self.depth = check_positive_int("depth", depth)
        self.a = check_positive_number("a", a)
        self.b = check_finite_number("b", b)
        super().__init__(self.a / self.depth**self.b, distribution, seed, input_axes,
                         output_axes)

    def get_config(self):
        config = super().get_config()
        del config["gain"]
        return {"depth": self.depth, "a": self.a, "b": self.b, **config}
