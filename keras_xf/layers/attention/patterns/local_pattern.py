"""Local (span-based) attention field `π_i = [i − w_l, i + w_r]` (survey §5.1)."""

import math

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else "a non-negative int"
        raise ValueError(f"{name} must be {kind}. Received: {name}={value}")


@keras.saving.register_keras_serializable(package="keras_xf")
class LocalPattern(AttentionPattern):
    """Local attention: query `i` attends to the keys in `π_i = [a_i^l, a_i^r]`.

    Survey §5.1 ("Span-based Attention / Local Attention"): `π_i = [a_i^l, a_i^r]` with
    `a_i^l = i − window_left` and `a_i^r = i + window_right`, so `M'(i, j) = 0` for
    `j ∈ π_i` and `−∞` otherwise. With `window_right=0` and a causal mask this is the
    sliding window of `window_left + 1` tokens.

    `MultiHeadAttention` computes self-attention with this pattern block-sparsely (blocks of
    `max(window_left, window_right)` positions; memory O(n·w) instead of O(n²),
    `keras_xf.ops.block_sparse_attention`) when nothing needs the dense scores, and decodes
    with a rolling cache of `window_left + 1` slots (`cache_slots`): slot `p mod slots`
    holds position `p`, so the cache stays window-sized however long the generation.

    Args:
        window_left: int ≥ 0, keys allowed before the query.
        window_right: int ≥ 0, keys allowed after the query (masked anyway when causal).
        block_sparse: bool, let `MultiHeadAttention` use the block-sparse computation;
            `False` always takes the dense masked path (same numbers).
        rolling_cache: bool, let `MultiHeadAttention.init_cache` allocate `window_left + 1`
            slots instead of the full length.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`, absolute query positions.
        key_positions: int32 `[S]`, absolute key positions.

    Returns:
        Boolean `[T, S]`, `True` where `−window_left ≤ j − i ≤ window_right`.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, pattern=LocalPattern(window_left=64), causal=True)
    >>> y = mha(keras.random.normal((1, 1024, 32)))  # memory O(1024 · 64)
    """

    def __init__(self, window_left, window_right=0, block_sparse=True, rolling_cache=True,
                 **kwargs):
        super().__init__(**kwargs)
        _check_int("window_left", window_left, 0)
        _check_int("window_right", window_right, 0)
        self.window_left = window_left
        self.window_right = window_right
        self.block_sparse = bool(block_sparse)
        self.rolling_cache = bool(rolling_cache)

    @property
    def cache_slots(self):
        """Cache slots a causal decoder needs (the query and `window_left` keys before it),
        or `None` without `rolling_cache`."""
        return self.window_left + 1 if self.rolling_cache else None

    def field(self, query_positions, key_positions):
        """`j ∈ π_i`, elementwise over broadcastable position tensors."""
        distance = key_positions - query_positions
        return ops.logical_and(distance >= -self.window_left, distance <= self.window_right)

    def block_layout(self, length):
        """`(block_size, key block offsets)` covering the field for a sequence of `length`."""
        size = min(max(self.window_left, self.window_right, 1), length)
        left = math.ceil(self.window_left / size)
        right = math.ceil(self.window_right / size)
        return size, tuple(range(-left, right + 1))

    def call(self, query_positions, key_positions, query=None, key=None):
        return self.field(query_positions[:, None], key_positions[None, :])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "window_left": self.window_left,
                "window_right": self.window_right,
                "block_sparse": self.block_sparse,
                "rolling_cache": self.rolling_cache,
            }
        )
        return config
