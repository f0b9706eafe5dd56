"""Strided attention field: overlapping windows moved by a stride (survey §5.1)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int. Received: {name}={value}")


@keras.saving.register_keras_serializable(package="keras_xf")
class StridedPattern(AttentionPattern):
    """Strided attention: a context window of `window` positions slides along the sequence,
    moving `stride` positions at a time; query `i` attends to every key that shares a
    window with it.

    Survey §5.1 ("Strided Attention"): the windows are `W_k = [k · stride,
    k · stride + window − 1]`, `k = 0, 1, …`, and `π_i = ∪_{k : i ∈ W_k} W_k`. Query `i` and
    key `j` share a window when `max(i, j) − stride · ⌊min(i, j) / stride⌋ < window` (the
    latest window starting at or before `min(i, j)` reaches furthest). With
    `stride = window` the windows do not overlap and this is `ChunkedPattern(window)`; with
    `stride = 1` it is the band `|i − j| < window`.

    `MultiHeadAttention` computes self-attention with it block-sparsely (blocks of `window`
    positions, memory O(n·window)) when nothing needs the dense scores, and decodes with a
    rolling cache of `window` slots (`cache_slots`).

    Args:
        window: int > 0, the context window size.
        stride: int in `[1, window]`, the step between windows (a larger stride would leave
            positions outside every window).
        block_sparse: bool, let `MultiHeadAttention` use the block-sparse computation.
        rolling_cache: bool, let `MultiHeadAttention.init_cache` allocate `window` slots.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]` (absolute positions).

    Returns:
        Boolean `[T, S]`, `True` where query and key share a window.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, pattern=StridedPattern(window=128, stride=64))
    >>> y = mha(keras.random.normal((1, 1024, 32)))
    """

    def __init__(self, window, stride, block_sparse=True, rolling_cache=True, **kwargs):
        super().__init__(**kwargs)
        _check_positive("window", window)
        _check_positive("stride", stride)
        if stride > window:
            raise ValueError(
                "stride must not exceed window (positions between windows would attend to "
                f"nothing). Received: window={window}, stride={stride}"
            )
        self.window = window
        self.stride = stride
        self.block_sparse = bool(block_sparse)
        self.rolling_cache = bool(rolling_cache)

    @property
    def cache_slots(self):
        """Cache slots a causal decoder needs (a key shares a window with the query only when
        it is fewer than `window` positions before it), or `None` without `rolling_cache`."""
        return self.window if self.rolling_cache else None

    def field(self, query_positions, key_positions):
        """`j ∈ π_i`, elementwise over broadcastable position tensors."""
        low = ops.minimum(query_positions, key_positions)
        high = ops.maximum(query_positions, key_positions)
        start = ops.floor_divide(low, self.stride) * self.stride
        return high - start < self.window

    def block_layout(self, length):
        """`(block_size, key block offsets)`: blocks of `window`; the field of a query lies in
        its own block and the two next to it (only its own when `stride = window`)."""
        size = min(self.window, length)
        return size, (0,) if self.stride == self.window else (-1, 0, 1)

    def call(self, query_positions, key_positions, query=None, key=None):
        return self.field(query_positions[:, None], key_positions[None, :])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "window": self.window,
                "stride": self.stride,
                "block_sparse": self.block_sparse,
                "rolling_cache": self.rolling_cache,
            }
        )
        return config
