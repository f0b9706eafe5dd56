"""Attention field by locality-sensitive hashing of queries and keys (survey §5.1, Reformer)."""

import keras
import numpy as np
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_seed
from keras_xf.layers.attention.patterns._validation import draw_seed
from keras_xf.layers.attention.patterns._validation import key_heads_like_query


@keras.saving.register_keras_serializable(package="keras_xf")
class HashingPattern(AttentionPattern):
    """Learned field by hashing: `π_i = {j : h(q_i) = h(k_j)}`, `h(x) = argmax([xR; −xR])`.

    Survey §5.1 (learning attention fields): hashing functions group similar query and key
    vectors, and positions attend only within their group (Reformer). `h` is the angular
    locality-sensitive hash by a random rotation `R ∈ ℝ^{Dh × b/2}`: a vector goes to the
    bucket of the largest of `[xR; −xR]`, so nearby directions tend to share a bucket. The
    projected queries and keys of each head are hashed with the same rotations; with
    `num_hashes = n` rounds (independent rotations) a pair is allowed when it shares a
    bucket in any round. The rotations are drawn once, at build time, from `seed` and kept
    as a non-trainable weight `[Dh, n, b/2]`, so a saved model hashes identically.

    With `chunk_size = c`, the sort-and-chunk scheme of the survey and Reformer is used
    instead: queries and keys are each sorted by (bucket, position), cut into chunks of
    `c` consecutive sorted items, and query `i` attends to the keys whose chunk is its own
    chunk or the one before it. It is computed as a dense mask with `argsort` (static
    shapes), so it gives the field, not the savings of a chunked kernel.

    Cached decoding: without `chunk_size` the field of a pair depends on that query and key
    only, so token-by-token decoding equals the full pass (`supports_decoding = True`).
    With `chunk_size` the sorting involves every key, including later ones, so the pattern
    refuses `cache_index`.

    Args:
        num_buckets: even int `b ≥ 2`, the number of hash buckets.
        chunk_size: positive int `c` for the sort-and-chunk field, or `None`.
        num_hashes: positive int `n`, hashing rounds.
        seed: int or `None`, the seed of the rotations (a fresh seed when `None`).
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.
        query: `[B, T, H, Dh]`, the projected queries; key: `[B, S, Hkv, Dh]`.

    Returns:
        Boolean `[B, H, T, S]`.

    Example:
    >>> pattern = HashingPattern(num_buckets=4, seed=0)
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    uses_states = True

    def __init__(self, num_buckets, chunk_size=None, num_hashes=1, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_buckets", num_buckets, minimum=2)
        if num_buckets % 2:
            raise ValueError(
                "num_buckets must be even (buckets come in ±xR pairs). "
                f"Received: num_buckets={num_buckets}"
            )
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size)
        check_positive_int("num_hashes", num_hashes)
        seed = check_seed(seed)
        self.num_buckets = num_buckets
        self.chunk_size = chunk_size
        self.num_hashes = num_hashes
        self.seed = seed
        self.supports_decoding = chunk_size is None

    def build(self, input_shape=None):
        if input_shape is None or len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "HashingPattern is built with the attention's head shape [B, T, H, Dh] "
                f"(MultiHeadAttention does this). Received: input_shape={input_shape}"
            )
        rng = np.random.default_rng(draw_seed(self.seed))
        shape = (input_shape[-1], self.num_hashes, self.num_buckets // 2)
        rotations = rng.standard_normal(shape).astype("float32")
        self.rotations = self.add_weight(
            name="rotations",
            shape=shape,
            dtype="float32",
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(rotations, "float32"),
            trainable=False,
            autocast=False,
        )
        self.built = True

    def _buckets(self, states):
        """`argmax([xR; −xR])`: int32 `[B, H, n, L]` buckets of `states` `[B, L, H, Dh]`."""
        states = ops.stop_gradient(ops.cast(states, "float32"))
        rotated = ops.einsum("blhd,dnk->bhnlk", states, ops.cast(self.rotations, "float32"))
        return ops.cast(ops.argmax(ops.concatenate([rotated, -rotated], axis=-1), axis=-1), "int32")

    def _chunks(self, buckets):
        """Chunk index of each item after sorting by (bucket, position)."""
        length = ops.shape(buckets)[-1]
        order = buckets * length + ops.arange(length, dtype="int32")
        rank = ops.argsort(ops.argsort(order, axis=-1), axis=-1)
        return ops.cast(rank, "int32") // self.chunk_size

    def call(self, query_positions, key_positions, query=None, key=None):
        if query is None or key is None:
            raise ValueError(
                "HashingPattern needs the projected query and key. Received: "
                f"query={'None' if query is None else 'a tensor'}, "
                f"key={'None' if key is None else 'a tensor'}"
            )
        query_buckets = self._buckets(query)
        key_buckets = self._buckets(key_heads_like_query(query, key))
        if self.chunk_size is None:
            same = ops.equal(query_buckets[..., :, None], key_buckets[..., None, :])
        else:
            query_chunks = self._chunks(query_buckets)[..., :, None]
            key_chunks = self._chunks(key_buckets)[..., None, :]
            same = ops.logical_or(
                ops.equal(key_chunks, query_chunks), ops.equal(key_chunks, query_chunks - 1)
            )
        return ops.any(same, axis=2)  # any hashing round: [B, H, T, S]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "chunk_size": self.chunk_size,
                "num_hashes": self.num_hashes,
                "seed": self.seed,
            }
        )
        return config
