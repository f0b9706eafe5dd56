"""Chunked attention field: each query attends within its own chunk (survey §5.1)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern


@keras.saving.register_keras_serializable(package="keras_xf")
class ChunkedPattern(AttentionPattern):
    """Chunked attention: the sequence is cut into chunks `[c_k^l, c_k^r]` of `chunk_size`
    positions and query `i` attends only within its own chunk.

    Survey §5.1 ("Chunked Attention"): `chunk_k = [c_k^l, c_k^r]` with equal-length chunks
    `c_k^l = k · chunk_size`, `c_k^r = c_k^l + chunk_size − 1`; `π_i = chunk_k` for the chunk
    holding `i`, i.e. `⌊i / chunk_size⌋ = ⌊j / chunk_size⌋`.

    `MultiHeadAttention` computes self-attention with it block-sparsely (one block per chunk,
    memory O(n·chunk_size)) when nothing needs the dense scores, and decodes with a rolling
    cache of `chunk_size` slots (`cache_slots`).

    Args:
        chunk_size: int > 0.
        block_sparse: bool, let `MultiHeadAttention` use the block-sparse computation.
        rolling_cache: bool, let `MultiHeadAttention.init_cache` allocate `chunk_size` slots.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]` (absolute positions).

    Returns:
        Boolean `[T, S]`, `True` where query and key share a chunk.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, pattern=ChunkedPattern(chunk_size=128))
    >>> y = mha(keras.random.normal((1, 1024, 32)))
    """

    def __init__(self, chunk_size, block_sparse=True, rolling_cache=True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive int. Received: chunk_size={chunk_size}")
        self.chunk_size = chunk_size
        self.block_sparse = bool(block_sparse)
        self.rolling_cache = bool(rolling_cache)

    @property
    def cache_slots(self):
        """Cache slots a causal decoder needs (a whole chunk), or `None` without
        `rolling_cache`."""
        return self.chunk_size if self.rolling_cache else None

    def field(self, query_positions, key_positions):
        """`j ∈ π_i`, elementwise over broadcastable position tensors."""
        return ops.equal(
            ops.floor_divide(query_positions, self.chunk_size),
            ops.floor_divide(key_positions, self.chunk_size),
        )

    def block_layout(self, length):
        """`(block_size, key block offsets)`: one block per chunk (one block when shorter)."""
        return min(self.chunk_size, length), (0,)

    def call(self, query_positions, key_positions, query=None, key=None):
        return self.field(query_positions[:, None], key_positions[None, :])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "chunk_size": self.chunk_size,
                "block_sparse": self.block_sparse,
                "rolling_cache": self.rolling_cache,
            }
        )
        return config
