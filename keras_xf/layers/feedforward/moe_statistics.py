"""Router statistics of a mixture of experts, reported as a Keras metric (survey §5.6)."""

import keras
from keras import ops


class RouterStatistics(keras.metrics.Metric):
    """Expert load and drop rate of a `MixtureOfExperts`, as entries of `fit` / `evaluate` logs.

    Keras 3 has no `add_metric`, and on JAX a metric updated inside a layer's `call` is lost
    (the stateless forward pass returns only the model's non-trainable variables). So the
    counts live in the layer as non-trainable float32 variables (`router_assignments [M]`,
    `router_dropped`, `router_total`), which the forward pass updates on every backend; this
    metric, owned by the layer and therefore listed in `model.metrics`, turns them into
    `drop_rate = dropped / assignments` and `load_<i> = assignments_i / Σ_j assignments_j`,
    accumulated since the last `reset_state()` (Keras resets metrics at each epoch and
    evaluation). The log keys are the layer's path followed by `/drop_rate` and `/load_<i>`.

    On JAX the trainer holds the variables outside the layer during an epoch, so the
    per-step progress-bar values of these entries read zero; the epoch logs (`History`,
    `evaluate`) are exact. On TensorFlow and PyTorch both are exact.

    Args:
        layer: the `MixtureOfExperts` whose counts are reported.
        name: the metric name.
    """

    def __init__(self, layer, name="router_statistics", **kwargs):
        super().__init__(name=name, **kwargs)
        # A closure keeps the layer out of the metric's tracked state.
        self._layer = lambda: layer

    @staticmethod
    def make_variables(layer):
        """The count variables `(router_assignments [M], router_dropped, router_total)`,
        weights of `layer` (made in its `build`, which keeps them as its attributes)."""

        def count(name, shape):
            return layer.add_weight(name=name, shape=shape, initializer="zeros",
                                    trainable=False, dtype="float32", autocast=False)

        return (count("router_assignments", (layer.num_experts,)),
                count("router_dropped", ()), count("router_total", ()))

    def record(self, counts, kept, valid):
        """Adds one forward pass: `counts [M]` routed assignments, booleans `kept` (a subset
        of the valid assignments) and `valid`, of any layout."""
        layer = self._layer()
        if not layer.built:
            return
        valid = ops.reshape(ops.cast(valid, "float32"), (-1,))
        kept = ops.reshape(ops.cast(kept, "float32"), (-1,))
        total = ops.sum(valid)
        layer.router_assignments.assign_add(ops.cast(counts, "float32"))
        layer.router_dropped.assign_add(total - ops.sum(kept))
        layer.router_total.assign_add(total)

    def update_state(self, *args, **kwargs):
        """Nothing to do: the layer records its counts in its forward pass."""

    def reset_state(self):
        layer = self._layer()
        if not layer.built:
            return
        for variable in (layer.router_assignments, layer.router_dropped, layer.router_total):
            variable.assign(ops.zeros(variable.shape, "float32"))

    def result(self):
        layer = self._layer()
        prefix = layer.path or layer.name
        if not layer.built:
            return {}
        assignments, dropped, total = (
            _read(v) for v in (layer.router_assignments, layer.router_dropped, layer.router_total))
        results = {f"{prefix}/drop_rate": dropped / ops.maximum(total, 1.0)}
        loads = assignments / ops.maximum(ops.sum(assignments), 1.0)
        for index in range(layer.num_experts):
            results[f"{prefix}/load_{index}"] = loads[index]
        return results


def _read(variable):
    """The variable's value; zeros while the JAX trainer holds the state: during an epoch
    the Keras variable has handed its value over and, read outside the trainer's scope,
    raises a `TypeError` (it keeps neither a value nor its initializer)."""
    try:
        value = variable.value
    except TypeError:
        return ops.zeros(variable.shape, "float32")
    return ops.convert_to_tensor(value)
