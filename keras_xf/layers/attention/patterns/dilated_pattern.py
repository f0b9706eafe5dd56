"""Dilated window attention field (survey §5.1, strided attention with a dilated window)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.ops.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_xf")
class DilatedPattern(AttentionPattern):
    """A dilated context window: `π_i = {j : |i − j| = m·d, m = 0, 1, …, w}`.

    Survey §5.1 (strided attention): the context window slides with the query, and a
    dilated window is discontinuous, keeping every `d`-th key with gaps of `d − 1` keys
    between them. Query `i` attends to the keys at distances `0, d, 2d, …, w·d` on both
    sides (`causal=False`) or only before it (`causal=True`, `j ≤ i`). With `dilation=1`
    it is the plain local window `[i − w, i + w]` (survey's `[a_i^l, a_i^r]`).

    The field depends on positions only, so cached decoding equals the full causal pass.

    Args:
        window: positive int `w`, how many dilated steps the window reaches on each side.
        dilation: positive int `d`, the distance between attended keys.
        causal: bool, keep only the left half of the window (`j ≤ i`).
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`, absolute positions of the queries.
        key_positions: int32 `[S]`, absolute positions of the keys.

    Returns:
        Boolean `[T, S]`, `True` where query `i` may attend to key `j`.

    Example:
    >>> pattern = DilatedPattern(window=2, dilation=2)
    >>> mha = MultiHeadAttention(num_heads=2, pattern=pattern)
    >>> y = mha(keras.random.normal((2, 8, 16)))  # (2, 8, 16)
    """

    uses_states = False
    supports_decoding = True

    def __init__(self, window, dilation=1, causal=False, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("window", window)
        check_positive_int("dilation", dilation)
        self.window = window
        self.dilation = dilation
        self.causal = bool(causal)

    def call(self, query_positions, key_positions, query=None, key=None):
        query_positions = ops.cast(query_positions, "int32")
        key_positions = ops.cast(key_positions, "int32")
        offset = query_positions[:, None] - key_positions[None, :]
        distance = offset if self.causal else ops.abs(offset)
        return ops.logical_and(
            ops.logical_and(distance >= 0, distance <= self.window * self.dilation),
            ops.equal(ops.mod(distance, self.dilation), 0),
        )

    def get_config(self):
        config = super().get_config()
        config.update({"window": self.window, "dilation": self.dilation, "causal": self.causal})
        return config
