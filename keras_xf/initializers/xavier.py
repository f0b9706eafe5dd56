"""Xavier initialisation with a gain (survey §4.2.2; Glorot and Bengio, 2010)."""

import keras

from keras_xf.ops.checks import check_positive_number

DISTRIBUTIONS = ("uniform", "normal")


@keras.saving.register_keras_serializable(package="keras_xf")
class Xavier(keras.initializers.VarianceScaling):
    """`W ~ U(−η, η)` with `η = gain · √(6 / (d_in + d_out))` (survey §4.2.2), or the normal
    distribution of the same variance, `N(0, η²/3)`, i.e. standard deviation
    `gain · √(2 / (d_in + d_out))` (Glorot's normal form, as DeepNet uses).

    With `gain = 1` it draws as Keras's `glorot_uniform` / untruncated `glorot_normal`.
    `d_in` and `d_out` are Keras's fans: the two axes of a matrix, the input and output
    axes that an `EinsumDense` names (`input_axes`, `output_axes`, which it sets itself), or
    the convolution convention for other kernels.

    Args:
        gain: positive float.
        distribution: `"uniform"` (the survey's first form) or `"normal"`.
        seed: optional int or `keras.random.SeedGenerator`.
        input_axes, output_axes: optional lists of axes whose sizes multiply to `d_in` and
            `d_out`.

    Example:
    >>> dense = keras.layers.Dense(16, kernel_initializer=Xavier(gain=0.5))
    """

    def __init__(self, gain=1.0, distribution="uniform", seed=None, input_axes=None,
                 output_axes=None):
        check_positive_number("gain", gain)
        if distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {DISTRIBUTIONS}. Received: "
                f"distribution={distribution!r}"
            )
        self.gain = gain
        super().__init__(
            scale=gain**2,
            mode="fan_avg",
            distribution="uniform" if distribution == "uniform" else "untruncated_normal",
            seed=seed,
            input_axes=input_axes,
            output_axes=output_axes,
        )
        self.distribution_name = distribution

    def get_config(self):
        config = {
            "gain": self.gain,
            "distribution": self.distribution_name,
            "seed": keras.saving.serialize_keras_object(self._init_seed),
        }
        if self.input_axes is not None or self.output_axes is not None:
            config.update(input_axes=self.input_axes, output_axes=self.output_axes)
        return config
