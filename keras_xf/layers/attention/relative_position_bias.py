"""T5-style bucketed relative position bias (cited in survey §4.1.3)."""

import keras
from keras import ops

from keras_xf.layers.attention.score_bias import ScoreBias
from keras_xf.layers.cloning import clone_initializer
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.positions import check_bucket_config
from keras_xf.ops.positions import relative_distance
from keras_xf.ops.positions import relative_position_buckets


@keras.saving.register_keras_serializable(package="keras_xf")
class RelativePositionBias(ScoreBias):
    """A learned scalar per head and bucket of relative distance, added to the scores.

    Survey §4.1.3 lists, besides the vector representations `PE(i, j)` of RPR, models that
    bring relative positions into attention in other ways (Raffel et al., T5). In T5 the
    distance `j − i` falls into one of `num_buckets` buckets (`relative_position_buckets`:
    exact buckets for small distances, logarithmically wider ones up to `max_distance`), and
    each head `h` learns one scalar per bucket:

        α_ij = Softmax(h_iᵠ·h_jᵏ · scale + b_{h, bucket(j − i)})

    Used as a `MultiHeadAttention(biases=[...])` hook. The table `[num_buckets, num_heads]`
    takes its head count from the queries when built. Positions are the absolute positions
    that `MultiHeadAttention` passes (offset by the cache index), so cached decoding gives the
    full pass's result. The bias depends on the positions alone (`positions_only`): a stack
    that shares it (`TransformerStack(share_score_biases=True)`, T5) computes it once.

    Args:
        num_buckets: int, buckets in all (even and ≥ 4 when bidirectional, ≥ 2 causal).
        max_distance: int, distances from it on share the last bucket (of each side).
        bidirectional: bool; `True` gives separate buckets to keys after the query (encoders),
            `False` gives all buckets to keys at or before it (decoders; later keys share
            bucket 0 and are masked by the causal mask anyway).
        embeddings_initializer: initializer of the table.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query: `[B, T, H, d_h]` projected queries (only the head count is used).
        key: `[B, S, Hkv, d_h]` projected keys (unused).
        query_positions: int `[T]`, key_positions: int `[S]`.

    Returns:
        float32 bias `[1, H, T, S]`.

    Example:
    >>> bias = RelativePositionBias(num_buckets=32, max_distance=128, bidirectional=False)
    >>> mha = MultiHeadAttention(num_heads=2, biases=[bias])
    >>> y = mha(keras.random.normal((2, 6, 16)), use_causal_mask=True)  # (2, 6, 16)
    """

    positions_only = True

    def __init__(
        self,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="random_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(bidirectional, bool):
            raise ValueError(f"bidirectional must be a bool. Received: bidirectional={bidirectional}")
        check_bucket_config(num_buckets, max_distance, bidirectional)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = get_initializer(
            "embeddings_initializer", embeddings_initializer
        )

    def build(self, query_shape):
        if query_shape is None or len(query_shape) != 4 or query_shape[2] is None:
            raise ValueError(
                "RelativePositionBias expects queries [batch, length, heads, head_dim] with a "
                f"known number of heads. Received: query_shape={query_shape}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, query_shape[2]),
            initializer=clone_initializer(self.embeddings_initializer),
        )

    def call(self, query, key, query_positions, key_positions):
        if query.shape[2] != self.embeddings.shape[1]:
            raise ValueError(
                f"RelativePositionBias was built for {self.embeddings.shape[1]} heads. "
                f"Received: query.shape={tuple(query.shape)}"
            )
        buckets = relative_position_buckets(
            relative_distance(query_positions, key_positions),
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
        )
        values = ops.take(ops.cast(self.embeddings, "float32"), buckets, axis=0)  # [T, S, H]
        return ops.transpose(values, (2, 0, 1))[None]

    def compute_output_shape(self, query_shape, key_shape=None, *args):
        key_length = None if key_shape is None else key_shape[1]
        return (1, query_shape[2], query_shape[1], key_length)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
