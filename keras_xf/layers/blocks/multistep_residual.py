"""Linear multi-step residual connections over earlier layer outputs (survey §4.3)."""

import numbers

import keras
from keras import ops

from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import static_dim

# Adams–Bashforth coefficients b_1 … b_p of the increments (newest first), a = [1].
ADAMS_BASHFORTH = {
    1: [1.0],
    2: [3 / 2, -1 / 2],
    3: [23 / 12, -16 / 12, 5 / 12],
    4: [55 / 24, -59 / 24, 37 / 24, -9 / 24],
}
PRESETS = tuple(f"adams_bashforth_{order}" for order in ADAMS_BASHFORTH)


def _coefficients(value, name):
    ok = isinstance(value, (list, tuple)) and value and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    if not ok:
        raise ValueError(f"{name} must be a non-empty list of numbers. Received: {name}={value!r}")
    return [float(v) for v in value]


def check_multistep(multistep):
    """`None`, a preset name (`PRESETS`) or `{"a": [a_1, …], "b": [b_1, …]}`; returned with
    lists of floats in the dict."""
    if multistep is None or multistep in PRESETS:
        return multistep
    if isinstance(multistep, dict) and set(multistep) == {"a", "b"}:
        return {"a": _coefficients(multistep["a"], "multistep['a']"),
                "b": _coefficients(multistep["b"], "multistep['b']")}
    raise ValueError(
        f"multistep must be None, one of {PRESETS} or a dict {{'a': [...], 'b': [...]}}. "
        f"Received: multistep={multistep!r}"
    )


def layer_coefficients(multistep, index):
    """`(a, b)` of layer `index` (0-based), which has `index + 1` earlier states and
    increments: an Adams–Bashforth preset starts with its lower orders (layer 0 is Euler),
    given coefficients are cut to the available terms."""
    if isinstance(multistep, str):
        order = min(int(multistep.rsplit("_", 1)[1]), index + 1)
        return [1.0], list(ADAMS_BASHFORTH[order])
    return multistep["a"][: index + 1], multistep["b"][: index + 1]


@keras.saving.register_keras_serializable(package="keras_xf")
class MultiStepResidual(keras.layers.Layer):
    """`z^l = Σ_{i=1}^{p} a_i · z^{l−i} + Σ_{i=1}^{q} b_i · f^{l−i+1}(z^{l−i})` (survey §4.3,
    the linear multi-step method with `h = 1`).

    `z^{l−i}` are the earlier layer outputs and `f^{j}(z^{j−1})` the increments the layers
    added (a layer's output minus its input; for a pre-norm layer the sum of its sub-layer
    branches, the `f` of the survey's ODE view). The Euler step `a = [1], b = [1]` is the
    plain residual stack; Adams–Bashforth of order 2 is `a = [1], b = [3/2, −1/2]`. With
    `trainable_coefficients` the `a_i` and `b_i` are weights (initialised to the given
    values, as in dynamic linear combinations of layers); otherwise they are constants.

    Args:
        a: list of `p` floats, the coefficients of `z^{l−1}, …, z^{l−p}`.
        b: list of `q` floats, the coefficients of the increments `f^l, …, f^{l−q+1}`.
        trainable_coefficients: bool.
        **kwargs: base `Layer` arguments.

    Call arguments:
        states: `[B, T, p', d]`, `p' ≥ p` earlier outputs stacked on axis −2, newest first
            (`z^{l−1}` first).
        increments: `[B, T, q', d]`, `q' ≥ q` increments, newest first (`f^l` first).

    Returns:
        `[B, T, d]`.

    Example:
    >>> step = MultiStepResidual(a=[1.0], b=[1.5, -0.5], trainable_coefficients=True)
    >>> z = step(keras.random.normal((2, 5, 1, 16)), keras.random.normal((2, 5, 2, 16)))
    """

    def __init__(self, a, b, trainable_coefficients=False, **kwargs):
        super().__init__(**kwargs)
        self.a = _coefficients(a, "a")
        self.b = _coefficients(b, "b")
        self.trainable_coefficients = check_bool("trainable_coefficients",
                                                 trainable_coefficients)

    def build(self, states_shape=None, increments_shape=None):
        if self.trainable_coefficients:
            self.a_weights = self.add_weight(
                shape=(len(self.a),), initializer=keras.initializers.Constant(self.a), name="a")
            self.b_weights = self.add_weight(
                shape=(len(self.b),), initializer=keras.initializers.Constant(self.b), name="b")

    def call(self, states, increments):
        check_rank("states", states, 4, "[batch, length, steps, dim]")
        check_rank("increments", increments, 4, "[batch, length, steps, dim]")
        p, q = len(self.a), len(self.b)
        for name, tensor, count in (("states", states, p), ("increments", increments, q)):
            steps = static_dim(tensor.shape[-2])
            if steps is not None and steps < count:
                raise ValueError(
                    f"MultiStepResidual needs {p} states and {q} increments: {name} must "
                    f"have shape [batch, length, >= {count}, dim]. Received: "
                    f"{name}.shape={tuple(tensor.shape)}"
                )
        dtype = states.dtype
        if self.trainable_coefficients:
            a, b = ops.cast(self.a_weights, dtype), ops.cast(self.b_weights, dtype)
        else:
            a, b = ops.convert_to_tensor(self.a, dtype), ops.convert_to_tensor(self.b, dtype)
        return (ops.einsum("btpd,p->btd", states[:, :, :p], a)
                + ops.einsum("btqd,q->btd", increments[:, :, :q], b))

    def compute_output_shape(self, states_shape, increments_shape=None):
        return tuple(states_shape[:-2]) + (states_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update({"a": list(self.a), "b": list(self.b),
                       "trainable_coefficients": self.trainable_coefficients})
        return config
