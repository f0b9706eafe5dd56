"""The base of the multiplicative score hook plugged in as `MultiHeadAttention(multiplier=...)`
(survey §3.2, §4.1.1)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_xf")
class ScoreMultiplier(keras.layers.Layer):
    """A factor of the attention scores: `scores = (q·kᵀ·scale + Σ bias) ⊙ multiplier(q, k, …)`.

    `MultiHeadAttention` calls the multiplier with the projected queries `[B, T, H, Dh]`,
    keys `[B, S, Hkv, Dh]` and the int32 absolute positions `[T]`, `[S]`, and multiplies the
    scores by the result (broadcastable to `[B, H, T, S]`) on its explicit path (the fused
    kernels take no multiplier). This base class is the factor one (`[1, 1, T, S]`), the
    neutral element; subclasses override `call(query, key, query_positions, key_positions)`.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, multiplier=ScoreMultiplier())  # scores times one
    >>> y = mha(keras.random.normal((2, 6, 16)))  # (2, 6, 16), as without a multiplier
    """

    def call(self, query, key, query_positions, key_positions):
        return ops.ones((1, 1, ops.shape(query_positions)[0], ops.shape(key_positions)[0]),
                        "float32")
