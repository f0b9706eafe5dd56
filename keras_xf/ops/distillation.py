"""Knowledge-distillation losses (survey §5.7): soft targets and hidden states, masked."""

import keras
from keras import ops

SOFT_LOSSES = ("kl", "cross_entropy")


def _token_weights(weights, per_position):
    """`weights` as float32 of the shape of `per_position` (ones when `None`)."""
    ones = ops.ones_like(per_position)
    if weights is None:
        return ones
    weights = ops.cast(weights, "float32")
    while len(weights.shape) < len(per_position.shape):
        weights = weights[..., None]
    return weights * ones


def _weighted_mean(values, weights):
    """`Σ_i w_i v_i / Σ_i w_i`, 0 when every weight is 0."""
    total = ops.sum(weights)
    return ops.sum(values * weights) / ops.maximum(total, keras.backend.epsilon())


def soft_target_loss(teacher_logits, student_logits, temperature=1.0, weights=None, kind="kl"):
    """Word-level distillation `L = T² Σ_i w_i Loss(p̃_i, p_i) / Σ_i w_i` (survey §5.7).

    `p̃_i = softmax(z̃_i / T)` (teacher) and `p_i = softmax(z_i / T)` (student) at the
    temperature `T`; `Loss` is `KL(p̃_i ‖ p_i) = Σ_v p̃_iv (log p̃_iv − log p_iv)` (`"kl"`) or
    the cross-entropy `−Σ_v p̃_iv log p_iv` (`"cross_entropy"`; the KL plus the teacher's
    entropy, the same gradient). The `T²` factor keeps the gradient's scale independent of
    `T` (Hinton et al., 2015). With `w_i` the padding mask this is the survey's
    `(1/n) Σ_i Loss(p̃_i, p_i)` over the real tokens. Computed in float32; no gradient flows
    to the teacher.

    Args:
        teacher_logits: `[..., V]` logits of the teacher.
        student_logits: `[..., V]` logits of the student, the same shape.
        temperature: float `T > 0`.
        weights: optional `[...]` (or a prefix of it, e.g. `[B]`) per-position weights;
            0 excludes a position (padding).
        kind: `"kl"` or `"cross_entropy"`.

    Returns:
        float32 scalar.
    """
    if kind not in SOFT_LOSSES:
        raise ValueError(f"kind must be one of {SOFT_LOSSES}. Received: kind={kind!r}")
    teacher = ops.stop_gradient(ops.cast(teacher_logits, "float32")) / temperature
    student = ops.cast(student_logits, "float32") / temperature
    teacher_log_probs = ops.log_softmax(teacher, axis=-1)
    student_log_probs = ops.log_softmax(student, axis=-1)
    teacher_probs = ops.exp(teacher_log_probs)
    if kind == "kl":
        per_position = ops.sum(teacher_probs * (teacher_log_probs - student_log_probs), axis=-1)
    else:
        per_position = -ops.sum(teacher_probs * student_log_probs, axis=-1)
    weights = _token_weights(weights, per_position)
    return (temperature**2) * _weighted_mean(per_position, weights)


def hidden_state_loss(teacher_states, student_states, weights=None):
    """Hidden-state distillation `L = Σ_i w_i ‖h̃_i − h_i‖² / (d Σ_i w_i)` (survey §5.7).

    The mean squared error between the teacher's states `h̃_i` and the student's `h_i`
    (already projected to the teacher's width `d`), over the positions with `w_i > 0`.
    Computed in float32; no gradient flows to the teacher.

    Args:
        teacher_states: `[..., d]`.
        student_states: `[..., d]`, the same shape.
        weights: optional `[...]` (or a prefix of it) per-position weights.

    Returns:
        float32 scalar.
    """
    teacher = ops.stop_gradient(ops.cast(teacher_states, "float32"))
    student = ops.cast(student_states, "float32")
    per_position = ops.mean(ops.square(student - teacher), axis=-1)
    weights = _token_weights(weights, per_position)
    return _weighted_mean(per_position, weights)
