"""The base of the query/key transforms plugged in as `MultiHeadAttention(position=...)`
(survey §4.1, rotary positions)."""

import keras


@keras.saving.register_keras_serializable(package="keras_xf")
class PositionHook(keras.layers.Layer):
    """Transforms the projected queries and keys by their positions before the scores:
    `q, k = position.rotate(q, k, query_positions, key_positions)`.

    `MultiHeadAttention` calls `rotate` with queries `[B, T, H, Dh]`, keys `[B, S, Hkv, Dh]`
    and their int32 absolute positions `[T]`, `[S]` (offset by the cache index), so a
    position hook works unchanged with a KV cache. This base class is the identity.
    Class attributes tell `MultiHeadAttention` what the hook needs:
    - `rotates_pairs`: the hook rotates pairs of features (RoPE), so the width of the query
      and key heads (`qk_dim`) must be even.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, position=PositionHook())  # positions unchanged
    >>> y = mha(keras.random.normal((2, 6, 16)))  # (2, 6, 16), as without a position hook
    """

    rotates_pairs = False

    def rotate(self, query, key, query_positions, key_positions):
        """Returns `(query, key)`, transformed by their positions."""
        return query, key

    def call(self, inputs, positions=None):
        return inputs
