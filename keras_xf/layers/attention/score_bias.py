"""The base of the additive score hooks plugged in as `MultiHeadAttention(biases=[...])`
(survey §4.1, §6)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_xf")
class ScoreBias(keras.layers.Layer):
    """An additive term of the attention scores: `scores = q·kᵀ·scale + Σ bias(q, k, …)`.

    `MultiHeadAttention` calls each bias with the projected queries `[B, T, H, Dh]`, keys
    `[B, S, Hkv, Dh]` and the int32 absolute positions `[T]`, `[S]` of queries and keys, and
    adds the result (broadcastable to `[B, H, T, S]`) to the scores before masking.

    This base class is the zero bias (`[1, 1, T, S]`), the neutral element. Subclasses
    override `call(query, key, query_positions, key_positions)` and declare what else they do:
    - `has_value_term`: the bias also adds `Σ_j α_ij · term_ij` to the attention output, so
      it provides `value_term(weights, value, query_positions, key_positions)` returning
      `[B, T, H, Dh]` (the value side of relative position representations, survey §4.1.2).
      Attention then takes the explicit path, which forms the weights `α`.
    - `mixes_weights`: the hook is not added to the scores; instead it provides
      `mix_weights(weights, query, key, query_positions, key_positions, mask)`, applied to
      the softmax weights (e.g. the locality-prior mixture of survey §4.1.1).
    - `positions_only`: the bias depends on the positions alone (not on `query` or `key`
      beyond their head count), so layers that share it (`TransformerStack(
      share_score_biases=True)`) may compute it once for all of them.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, biases=[ScoreBias()])  # adds zero to the scores
    >>> y = mha(keras.random.normal((2, 6, 16)))  # (2, 6, 16), as without a bias
    """

    has_value_term = False
    mixes_weights = False
    positions_only = False

    def call(self, query, key, query_positions, key_positions):
        return ops.zeros((1, 1, ops.shape(query_positions)[0], ops.shape(key_positions)[0]),
                         "float32")
