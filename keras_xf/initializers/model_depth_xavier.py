"""Xavier initialisation with a gain that grows with the model's depth (survey §4.2.2)."""

import keras

from keras_xf.initializers.xavier import Xavier
from keras_xf.ops.checks import check_finite_number
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number


@keras.saving.register_keras_serializable(package="keras_xf")
class ModelDepthXavier(Xavier):
    """Xavier with `gain = a · L^b` for every sub-layer of an `L`-layer model (survey
    §4.2.2, eq. `gain = a·L^b`): `η = a · L^b · √(6 / (d_in + d_out))`.

    Positive `b` gives deeper models larger initial weights; DeepNet's `β = (8N)^{-1/4}`
    is `a = 8^{-1/4}`, `b = −1/4`.

    Args:
        num_layers: int `L ≥ 1`.
        a: positive float.
        b: float exponent.
        distribution, seed, input_axes, output_axes: as `Xavier`.

    Example:
    >>> initializer = ModelDepthXavier(num_layers=24, a=1.0, b=0.5)
    >>> dense = keras.layers.Dense(16, kernel_initializer=initializer)
    """

    def __init__(self, num_layers, a=1.0, b=0.0, distribution="uniform", seed=None,
                 input_axes=None, output_axes=None):
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.a = check_positive_number("a", a)
        self.b = check_finite_number("b", b)
        super().__init__(self.a * self.num_layers**self.b, distribution, seed, input_axes,
                         output_axes)

    def get_config(self):
        config = super().get_config()
        del config["gain"]
        return {"num_layers": self.num_layers, "a": self.a, "b": self.b, **config}
