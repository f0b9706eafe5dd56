"""The prefix-LM attention field of a decoder with a bidirectional prefix (survey §6.5)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_xf")
class PrefixAttentionMask(keras.layers.Layer):
    """The prefix-LM field: `allowed(i, j) = j < N or j ≤ i` over absolute positions.

    The `N` image positions attend to each other bidirectionally; every text position
    attends to the whole image and causally to the text (survey §6.5, decoder-only form).

    Args:
        prefix_length: int `N ≥ 0` (0 gives the causal mask).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]` queries (only their length is used).
        key_length: int or scalar tensor, keys `S` (a cache's length); default `T`.
        start_index: position of the first query (cached decoding).

    Returns:
        boolean `[T, S]`, an `attention_mask` for `MultiHeadAttention` (with
        `use_causal_mask=False`).

    Example:
    >>> mask = PrefixAttentionMask(2)(keras.ops.zeros((1, 4, 8)))  # (4, 4)
    """

    def __init__(self, prefix_length, **kwargs):
        super().__init__(**kwargs)
        if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or prefix_length < 0:
            raise ValueError(
                f"prefix_length must be an int >= 0. Received: prefix_length={prefix_length}"
            )
        self.prefix_length = prefix_length

    def call(self, inputs, key_length=None, start_index=0):
        length = ops.shape(inputs)[1]
        key_length = length if key_length is None else key_length
        queries = ops.arange(length, dtype="int32") + ops.cast(start_index, "int32")
        keys = ops.arange(key_length, dtype="int32")
        return ops.logical_or(
            ops.less(keys, self.prefix_length)[None, :],
            ops.less_equal(keys[None, :], queries[:, None]),
        )

    def compute_output_spec(self, inputs, key_length=None, start_index=0):
        length = inputs.shape[1]
        keys = length if key_length is None or not isinstance(key_length, int) else key_length
        return keras.KerasTensor((length, keys), dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update({"prefix_length": self.prefix_length})
        return config
