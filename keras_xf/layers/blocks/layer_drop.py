"""Layer drop: random skipping of whole layers in training (survey §4.2.4)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_seed

RESCALES = ("inference", "training")


@keras.saving.register_keras_serializable(package="keras_xf")
class LayerDrop(keras.layers.Layer):
    """Gates the increment `f^l(z^{l−1}) = Layer^l(z^{l−1}) − z^{l−1}` of a layer.

    Training: `z^l = z^{l−1} + g · f^l(z^{l−1})` with `g ~ Bernoulli(ρ)`, `ρ = 1 − rate`,
    drawn per example (shape `[B, 1, 1]`), so a dropped layer leaves its input unchanged.
    The layer is still computed and its increment multiplied by zero: no Python branch on
    a tensor, static shapes, so the same graph compiles under XLA on every backend.

    Inference (`rescale="inference"`, the survey's form): `z^l = z^{l−1} + ρ · f^l(z^{l−1})`,
    the expected output of the trained ensemble (for a pre-norm layer
    `z^l = ρ · LNorm(F^l(z^{l−1})) + z^{l−1}`, survey §4.2.4). With `rescale="training"`
    the kept increments are divided by `ρ` in training instead and inference uses them as
    they are (inverted scaling, the same expectation).

    Args:
        rate: float in `[0, 1)`, the probability `p = 1 − ρ` of skipping a layer.
        rescale: `"inference"` or `"training"`.
        seed: optional int for the random gates.
        **kwargs: base `Layer` arguments.

    Call arguments:
        increment: `[B, T, d]`.
        training: bool.

    Returns:
        the scaled increment, `[B, T, d]`.

    Example:
    >>> drop = LayerDrop(0.2, seed=1)
    >>> f = drop(keras.random.normal((2, 5, 16)), training=True)  # zero rows for dropped examples
    """

    def __init__(self, rate, rescale="inference", seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_rate("rate", rate)
        if rescale not in RESCALES:
            raise ValueError(f"rescale must be one of {RESCALES}. Received: rescale={rescale!r}")
        self.rescale = rescale
        self.seed = check_seed(seed)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, increment, training=None):
        keep = 1.0 - self.rate
        if self.rate == 0:
            return increment
        if not training:
            return increment * keep if self.rescale == "inference" else increment
        shape = (ops.shape(increment)[0],) + (1,) * (len(increment.shape) - 1)
        draws = keras.random.uniform(shape, seed=self.seed_generator)
        gate = ops.cast(draws < keep, increment.dtype)
        if self.rescale == "training":
            gate = gate / keep
        return increment * gate

    def compute_output_shape(self, increment_shape):
        return tuple(increment_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "rescale": self.rescale, "seed": self.seed})
        return config
