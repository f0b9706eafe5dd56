"""Numpy oracle for survey §5.7: word-level and hidden-state knowledge distillation."""

import numpy as np


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def soft_target_loss(teacher_logits, student_logits, temperature, weights=None, kind="kl"):
    """`T² Σ_i w_i Loss(p̃_i, p_i) / Σ_i w_i`, `p̃ = softmax(z̃/T)`, `p = softmax(z/T)`;
    `Loss` = KL(p̃ ‖ p) or the cross-entropy −Σ p̃ log p."""
    log_p_teacher = log_softmax(np.asarray(teacher_logits, np.float64) / temperature)
    log_p_student = log_softmax(np.asarray(student_logits, np.float64) / temperature)
    p_teacher = np.exp(log_p_teacher)
    if kind == "kl":
        per_position = (p_teacher * (log_p_teacher - log_p_student)).sum(-1)
    else:
        per_position = -(p_teacher * log_p_student).sum(-1)
    w = np.ones(per_position.shape) if weights is None else np.asarray(weights, np.float64)
    w = np.broadcast_to(w.reshape(w.shape + (1,) * (per_position.ndim - w.ndim)),
                        per_position.shape)
    return temperature**2 * (per_position * w).sum() / w.sum()


def hidden_state_loss(teacher_states, student_states, weights=None, projection=None):
    """`Σ_i w_i ‖h̃_i − h_i W‖² / (d Σ_i w_i)` (`W` the identity when `projection` is None)."""
    student = np.asarray(student_states, np.float64)
    if projection is not None:
        student = student @ projection
    per_position = ((student - np.asarray(teacher_states, np.float64)) ** 2).mean(-1)
    w = np.ones(per_position.shape) if weights is None else np.asarray(weights, np.float64)
    return (per_position * w).sum() / w.sum()
