"""Attention with linear biases (ALiBi), cited in the survey's summary (§7)."""

import keras
from keras import ops

from keras_xf.layers.attention.score_bias import ScoreBias
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.positions import alibi_slope_values
from keras_xf.ops.positions import relative_distance


@keras.saving.register_keras_serializable(package="keras_xf")
class AlibiBias(ScoreBias):
    """A fixed penalty linear in the distance, one slope per head (ALiBi, Press et al.).

    The survey's summary (§7) notes that position scalars added to the attention scores
    (Press et al.) extrapolate to sequences longer than those seen in training. Head `h`
    penalises a key by its distance from the query:

        α_ij = Softmax(h_iᵠ·h_jᵏ · scale − m_h · |i − j|)

    with the geometric slopes `m_h = 2^(−8h/H)`, `h = 1 … H` (`alibi_slopes`, which
    interleaves the slopes of the neighbouring powers of two when `H` is not one). For causal
    attention every key a query sees has `j ≤ i`, so this is ALiBi's `−m_h · (i − j)`; for
    bidirectional attention the same formula penalises keys on both sides symmetrically.

    Used as a `MultiHeadAttention(biases=[...])` hook; no weights (the head count comes from
    the queries). Positions are the absolute positions that `MultiHeadAttention` passes
    (offset by the cache index), so cached decoding gives the full pass's result.

    Args:
        max_bias: positive float, the `8` of `2^(−8h/H)`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query: `[B, T, H, d_h]` projected queries (only the head count is used).
        key: `[B, S, Hkv, d_h]` projected keys (unused).
        query_positions: int `[T]`, key_positions: int `[S]`.

    Returns:
        float32 bias `[1, H, T, S]`.

    Example:
    >>> mha = MultiHeadAttention(num_heads=4, biases=[AlibiBias()])
    >>> y = mha(keras.random.normal((2, 6, 16)), use_causal_mask=True)  # (2, 6, 16)
    """

    def __init__(self, max_bias=8.0, **kwargs):
        super().__init__(**kwargs)
        self.max_bias = float(check_positive_number("max_bias", max_bias))
        self._num_heads = None  # known once built

    def build(self, query_shape=None):
        if query_shape is not None and (len(query_shape) != 4 or query_shape[2] is None):
            raise ValueError(
                "AlibiBias expects queries [batch, length, heads, head_dim] with a known number "
                f"of heads. Received: query_shape={query_shape}"
            )
        self._num_heads = None if query_shape is None else int(query_shape[2])

    def call(self, query, key, query_positions, key_positions):
        # The head count is static: the queries' own, or the built one where a tracer (the
        # traced PyTorch decoding step) turns shapes into tensors.
        heads = query.shape[2]
        if not isinstance(heads, int) and self._num_heads is not None:
            heads = self._num_heads
        slopes = ops.convert_to_tensor(alibi_slope_values(int(heads), self.max_bias),
                                       dtype="float32")
        distance = ops.cast(ops.abs(relative_distance(query_positions, key_positions)), "float32")
        return -slopes[None, :, None, None] * distance[None, None]

    def compute_output_shape(self, query_shape, key_shape=None, *args):
        key_length = None if key_shape is None else key_shape[1]
        return (1, query_shape[2], query_shape[1], key_length)

    def get_config(self):
        config = super().get_config()
        config.update({"max_bias": self.max_bias})
        return config
