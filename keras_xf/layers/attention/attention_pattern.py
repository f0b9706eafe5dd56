"""The base of the sparse attention fields plugged in as `MultiHeadAttention(pattern=...)`
(survey §5.1)."""

import keras


@keras.saving.register_keras_serializable(package="keras_xf")
class AttentionPattern(keras.layers.Layer):
    """An attention field: which keys each query may attend to, as a boolean mask.

    Survey §5.1: sparse attention restricts the key set of query `i` to a field `F(i)`, so
    `α_ij = 0` for `j ∉ F(i)`. A pattern is called by `MultiHeadAttention` with the absolute
    positions of the queries and keys (so it works unchanged with a KV cache, where the query
    positions start at the cache index) and returns a boolean mask broadcastable to
    `[batch, heads, query_length, key_length]`, `True` where attention is allowed. The mask is
    combined with the padding, causal and attention masks by logical and; a query whose
    whole field is masked gets zero weights, never NaN.

    This base class is the full field (every key allowed), the neutral element of
    `HybridPattern`-style unions and intersections. Subclasses override
    `call(query_positions, key_positions, query=None, key=None)`.
    Class attributes tell `MultiHeadAttention` what the pattern needs:
    - `uses_states`: the field depends on the projected queries and keys (learned fields by
      hashing or clustering); they are passed as `query` `[B, T, H, Dh]` and `key`
      `[B, S, Hkv, Dh]`. Patterns of positions alone get `None`.
    - `supports_decoding`: the field of a query depends only on its own position and the keys
      before it, so token-by-token cached decoding gives the full pass's result. A pattern
      that sets it to `False` raises a `ValueError` when used with `cache_index`.
    - `block_sparse`: self-attention may compute only the blocks the field touches
      (`keras_xf.ops.block_sparse_attention`); such a pattern provides `field` and
      `block_layout(length) -> (block_size, block_offsets)`.
    - `cache_slots`: an int when a query's keys lie within a fixed number of the latest
      positions, so `MultiHeadAttention.init_cache` allocates a rolling cache of that many
      slots; `None` for a cache of the full length.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, pattern=AttentionPattern())  # every key allowed
    >>> y = mha(keras.random.normal((2, 6, 16)))  # (2, 6, 16), as without a pattern
    """

    uses_states = False
    supports_decoding = True
    block_sparse = False
    cache_slots = None

    def call(self, query_positions, key_positions, query=None, key=None):
        return keras.ops.ones(
            (keras.ops.shape(query_positions)[0], keras.ops.shape(key_positions)[0]), "bool"
        )
