"""The summed cross-entropy of every exit of an early-exit classifier (survey §5.6)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_xf")
class EarlyExitLoss(keras.losses.Loss):
    """`L = Σ_e w_e · CE(y, p^{l_e})`: the cross-entropy of each exit's prediction against
    the same label, weighted, summed over the exits; in float32.

    The survey trains the exit classifiers together with the model on the sum of their
    cross-entropy losses (§5.6); `weights` gives each exit its share (equal by default).
    The exits lie on axis 1 of the predictions; the labels have the predictions' shape
    without it and without the class axis, so one loss serves a classifier (`[B, E, C]`
    against `[B]`) and a language model (`[B, E, T, V]` against `[B, T]`, one loss per
    token, to which Keras applies a `sample_weight` such as the padding mask as it does for
    a plain sparse cross-entropy).

    Args:
        weights: optional list of non-negative floats, one per exit (`None`: 1 each).
        from_logits: bool; `False` means the predictions are probabilities.

    Call: `y_true` int `[B, ...]`, `y_pred` `[B, E, ..., C]` (an `EarlyExitClassifier`'s or
    `EarlyExitCausalLM`'s outputs). Returns the losses `[B, ...]`.

    Example:
    >>> model.compile("adam", loss=EarlyExitLoss(weights=[0.5, 1.0]))
    """

    def __init__(self, weights=None, from_logits=True, name="early_exit_loss",
                 reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if weights is not None:
            weights = [float(w) for w in weights]
            if not weights or min(weights) < 0:
                raise ValueError(
                    "weights must be None or a non-empty list of non-negative floats. "
                    f"Received: weights={weights!r}"
                )
        self.weights = weights
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        """Per-example (per-token) losses `[B, ...]`."""
        rank = len(y_pred.shape)
        if rank < 3:
            raise ValueError(
                "y_pred must have shape [batch, exits, classes] or [batch, exits, length, "
                f"classes]. Received: shape={y_pred.shape}"
            )
        exits = y_pred.shape[1]
        if self.weights is not None and len(self.weights) != exits:
            raise ValueError(
                f"weights must hold one value per exit ({exits}). Received: "
                f"{len(self.weights)} weights"
            )
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            log_probs = ops.log(ops.clip(y_pred, 1e-7, 1.0))
        # Labels `[B, 1, ..., 1]`, one per exit after broadcasting (a trailing unit axis of
        # `y_true` is dropped by the reshape).
        shape = ops.shape(log_probs)
        label_shape = (shape[0], 1) + tuple(shape[2:-1]) + (1,)
        labels = ops.reshape(ops.cast(y_true, "int32"), label_shape)
        labels = ops.broadcast_to(labels, tuple(shape[:-1]) + (1,))
        nll = -ops.squeeze(ops.take_along_axis(log_probs, labels, axis=-1), axis=-1)
        weights = ops.ones((exits,)) if self.weights is None else ops.array(self.weights)
        weights = ops.reshape(ops.cast(weights, "float32"), (1, exits) + (1,) * (rank - 3))
        return ops.sum(nll * weights, axis=1)

    def get_config(self):
        return {"name": self.name, "weights": self.weights, "from_logits": self.from_logits,
                "reduction": self.reduction}


@keras.saving.register_keras_serializable(package="keras_xf")
def final_exit_accuracy(y_true, y_pred):
    """The accuracy of the last exit's prediction (`y_pred` `[B, E, ..., C]`), per example
    (per token for sequence outputs)."""
    predicted = ops.argmax(y_pred[:, -1], axis=-1)
    labels = ops.reshape(ops.cast(y_true, "int32"), ops.shape(predicted))
    return ops.cast(ops.equal(ops.cast(predicted, "int32"), labels), "float32")
