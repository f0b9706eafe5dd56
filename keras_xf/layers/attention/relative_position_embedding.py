"""Relative positional representations (RPR) of keys, values and queries (survey §4.1.3)."""

import keras
from keras import ops

from keras_xf.layers.attention.score_bias import ScoreBias
from keras_xf.layers.cloning import clone_initializer
from keras_xf.ops.attention import repeat_kv_heads
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.positions import clip_relative_distance
from keras_xf.ops.positions import relative_distance


@keras.saving.register_keras_serializable(package="keras_xf")
class RelativePositionEmbedding(ScoreBias):
    """Learned relative positional representations `PE(i, j) = u_{clip(j−i, k_rpr)}`.

    Survey §4.1.3 (Shaw et al.): each clipped distance `π ∈ [−k_rpr, k_rpr]` has a learned
    vector `u_π` (rows of `U_rpr ∈ R^{(2k_rpr+1)×d_h}`), with
    `clip(x, k_rpr) = max{−k_rpr, min{x, k_rpr}}`. The attention weights and outputs become

        α_ij = Softmax([h_iᵠ + PEᵠ(i,j)] [h_jᵏ + PEᵏ(i,j)]ᵀ · scale)
        c_i  = Σ_j α_ij h_jᵛ + Σ_j α_ij PEᵛ(i,j)

    Used as a `MultiHeadAttention(biases=[...])` hook. Since `MultiHeadAttention` already
    computes `h_iᵠ·h_jᵏ · scale`, this layer returns the rest of the expanded product:
    `scale · (h_iᵠ·PEᵏ(i,j) + PEᵠ(i,j)·h_jᵏ + PEᵠ(i,j)·PEᵏ(i,j))`, the last two terms only
    with `use_queries=True`; without it this is Shaw et al.'s form
    `α_ij = Softmax(h_iᵠ [h_jᵏ + PEᵏ(i,j)]ᵀ · scale)`. With `use_values=True` the value term
    `Σ_j α_ij PEᵛ(i,j)` is added to the attention output (`has_value_term`).

    As in the survey (and Shaw et al.), one table per role is shared by all heads; its
    width is the head width `d_h`. Positions are the absolute positions that
    `MultiHeadAttention` passes (offset by the cache index), so cached decoding gives the
    full pass's result.

    Args:
        max_distance: int `k_rpr ≥ 0`, the clipping distance.
        use_values: bool, add the value term `Σ_j α_ij PEᵛ(i,j)`.
        use_queries: bool, add `PEᵠ(i,j)` to the queries as well.
        scale: float, multiplies the terms; defaults to `1/√d_h` (the scale of the scores;
            set it to the attention layer's `scale` when that is not the default).
        embeddings_initializer: initializer of the tables.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query: `[B, T, H, d_h]` projected queries.
        key: `[B, S, Hkv, d_h]` projected keys.
        query_positions: int `[T]`, key_positions: int `[S]`.

    Returns:
        float32 bias `[B, H, T, S]`. `value_term(weights, value, query_positions,
        key_positions)` returns `[B, T, H, d_h]` in the value dtype.

    Example:
    >>> rpr = RelativePositionEmbedding(max_distance=4, use_values=True)
    >>> mha = MultiHeadAttention(num_heads=2, biases=[rpr])
    >>> y = mha(keras.random.normal((2, 6, 16)), use_causal_mask=True)  # (2, 6, 16)
    """

    def __init__(
        self,
        max_distance,
        use_values=False,
        use_queries=False,
        scale=None,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        embeddings_initializer = get_initializer("embeddings_initializer", embeddings_initializer)
        if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 0:
            raise ValueError(
                "max_distance (k_rpr) must be an int >= 0. "
                f"Received: max_distance={max_distance}"
            )
        if scale is not None:
            check_positive_number("scale", scale)
        self.max_distance = max_distance
        self.use_values = bool(use_values)
        self.use_queries = bool(use_queries)
        self.scale = None if scale is None else float(scale)
        self.embeddings_initializer = get_initializer("embeddings_initializer", embeddings_initializer)
        self.has_value_term = self.use_values

    def _table(self, name, head_dim):
        return self.add_weight(
            name=name,
            shape=(2 * self.max_distance + 1, head_dim),
            initializer=clone_initializer(self.embeddings_initializer),
        )

    def build(self, query_shape):
        if query_shape is None or len(query_shape) != 4 or query_shape[-1] is None:
            raise ValueError(
                "RelativePositionEmbedding expects queries [batch, length, heads, head_dim] "
                f"with a known head_dim. Received: query_shape={query_shape}"
            )
        head_dim = query_shape[-1]
        self.key_embeddings = self._table("key_embeddings", head_dim)
        self.query_embeddings = self._table("query_embeddings", head_dim) if self.use_queries else None
        self.value_embeddings = self._table("value_embeddings", head_dim) if self.use_values else None

    def _indices(self, query_positions, key_positions):
        """Rows of the tables, `clip(j − i, k_rpr) + k_rpr`, int32 `[T, S]`."""
        distance = relative_distance(query_positions, key_positions)
        return clip_relative_distance(distance, self.max_distance) + self.max_distance

    def call(self, query, key, query_positions, key_positions):
        scale = self.scale if self.scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
        indices = self._indices(query_positions, key_positions)  # [T, S]
        batch, heads = ops.shape(query)[0], query.shape[2]
        gather_shape = (batch, heads, ops.shape(indices)[0], ops.shape(indices)[1])
        gather = ops.broadcast_to(indices[None, None], gather_shape)
        # Score terms in float32: in float16 the products overflow on large inputs.
        key_table = ops.cast(self.key_embeddings, "float32")
        # h_iᵠ·u_r for every row r, then the row of each (i, j): [B, H, T, S].
        query_rows = ops.einsum("bthd,rd->bhtr", ops.cast(query, "float32"), key_table)
        bias = ops.take_along_axis(query_rows, gather, axis=-1)
        if self.use_queries:
            query_table = ops.cast(self.query_embeddings, "float32")
            key = ops.cast(repeat_kv_heads(key, heads), "float32")
            # u_rᵠ·h_jᵏ for every row r: [B, H, R, S], then the row of each (i, j).
            key_rows = ops.einsum("rd,bshd->bhrs", query_table, key)
            bias = bias + ops.take_along_axis(key_rows, gather, axis=-2)
            # PEᵠ(i,j)·PEᵏ(i,j) = u_rᵠ·u_rᵏ with the same row r = clip(j − i) + k_rpr.
            diagonal = ops.sum(
                ops.cast(self.query_embeddings, "float32") * ops.cast(self.key_embeddings, "float32"),
                axis=-1,
            )
            bias = bias + ops.take(diagonal, indices, axis=0)[None, None]
        return bias * scale

    def value_term(self, weights, value, query_positions, key_positions):
        """`Σ_j α_ij PEᵛ(i,j)` as `[B, T, H, d_h]`: the weights are summed per table row,
        `w_ir = Σ_{j: clip(j−i)+k = r} α_ij`, then `Σ_r w_ir u_rᵛ`."""
        indices = self._indices(query_positions, key_positions)
        one_hot = ops.one_hot(indices, 2 * self.max_distance + 1, dtype="float32")  # [T, S, R]
        row_weights = ops.einsum("bhts,tsr->bhtr", ops.cast(weights, "float32"), one_hot)
        table = ops.cast(self.value_embeddings, "float32")
        return ops.cast(ops.einsum("bhtr,rd->bthd", row_weights, table), value.dtype)

    def compute_output_shape(self, query_shape, key_shape=None, *args):
        key_length = None if key_shape is None else key_shape[1]
        return (query_shape[0], query_shape[2], query_shape[1], key_length)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_distance": self.max_distance,
                "use_values": self.use_values,
                "use_queries": self.use_queries,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
