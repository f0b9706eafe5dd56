"""Numpy oracle for linear recurrences `z_t = a_t ⊙ z_{t−1} + b_t` (survey §5.5)."""

import numpy as np


def linear_recurrence(a, b, initial_state=None):
    """A naive loop over axis 1 of `[B, T, ...]` arrays, in float64."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    a = np.broadcast_to(a, b.shape)
    state = np.zeros_like(b[:, 0]) if initial_state is None else np.asarray(initial_state, np.float64)
    state = np.broadcast_to(state, b[:, 0].shape)
    states = []
    for t in range(b.shape[1]):
        state = a[:, t] * state + b[:, t]
        states.append(state)
    return np.stack(states, axis=1)
