"""The warm-up / inverse-square-root learning rate of the original Transformer (survey §2.7)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_xf")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`η = η₀ · min(n^-0.5, n · n_warmup^-1.5)` (survey §2.7), with `n = step + 1`.

    The rate grows linearly for `warmup_steps` steps, peaks at `η₀ · n_warmup^-0.5`, then
    decays as `η₀ · n^-0.5`. The original Transformer uses `η₀ = d^-0.5`, `n_warmup = 4000`.

    Args:
        initial_learning_rate: float, `η₀`.
        warmup_steps: int > 0, `n_warmup`.

    Example:
    >>> schedule = NoamSchedule(512 ** -0.5, warmup_steps=4000)
    >>> optimizer = keras.optimizers.Adam(schedule, beta_2=0.98, epsilon=1e-9)
    """

    def __init__(self, initial_learning_rate, warmup_steps=4000):
        if not isinstance(warmup_steps, int) or warmup_steps <= 0:
            raise ValueError(f"warmup_steps must be a positive int. Received: warmup_steps={warmup_steps}")
        if initial_learning_rate <= 0:
            raise ValueError(
                "initial_learning_rate must be positive. Received: "
                f"initial_learning_rate={initial_learning_rate}"
            )
        self.initial_learning_rate = float(initial_learning_rate)
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(self.warmup_steps)
        return self.initial_learning_rate * ops.minimum(ops.power(step, -0.5), step * warmup**-1.5)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "warmup_steps": self.warmup_steps}
