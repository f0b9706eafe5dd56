"""A different attention field for each head (survey §5.1, hybrid methods)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.attention.patterns._validation import as_rank4
from keras_xf.layers.attention.patterns._validation import call_pattern
from keras_xf.layers.attention.patterns._validation import deserialize_patterns


@keras.saving.register_keras_serializable(package="keras_xf")
class PerHeadPattern(AttentionPattern):
    """One attention field per head: head `h` attends within `π_i^(h)`.

    Survey §5.1 (hybrid methods): different heads of multi-head attention may use different
    sparse models, e.g. one head local and another global (as in the Sparse Transformer and
    Longformer). Head `h` takes the mask of `patterns[h]` (its own head slice when that
    pattern gives per-head masks); the result is `[B|1, H, T, S]`. The number of patterns is
    checked against the attention's heads when the layer is built.

    Args:
        patterns: list of `AttentionPattern` layers, one per query head.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.
        query: `[B, T, H, Dh]`, key: `[B, S, Hkv, Dh]`, passed on to patterns using states.

    Returns:
        Boolean `[B|1, H, T, S]`.

    Example:
    >>> pattern = PerHeadPattern([DilatedPattern(window=1), GlobalPattern(num_global=1)])
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    def __init__(self, patterns, **kwargs):
        super().__init__(**kwargs)
        self.patterns = deserialize_patterns(patterns, "patterns")
        self.uses_states = any(p.uses_states for p in self.patterns)
        self.supports_decoding = all(p.supports_decoding for p in self.patterns)

    def build(self, input_shape=None):
        if input_shape is not None and len(input_shape) == 4:
            heads = input_shape[2]
            if heads is not None and heads != len(self.patterns):
                raise ValueError(
                    "PerHeadPattern needs one pattern per attention head. Received: "
                    f"{len(self.patterns)} patterns for num_heads={heads}"
                )
        for pattern in self.patterns:
            if not pattern.built:
                pattern.build(input_shape)
        self.built = True

    def call(self, query_positions, key_positions, query=None, key=None):
        masks = []
        for head, pattern in enumerate(self.patterns):
            mask = as_rank4(call_pattern(pattern, query_positions, key_positions, query, key))
            if mask.shape[1] != 1:
                mask = mask[:, head : head + 1]
            masks.append(mask)
        batch = 1
        for mask in masks:
            if mask.shape[0] != 1:
                batch = ops.shape(mask)[0]
                break
        shape = (batch, 1, ops.shape(query_positions)[0], ops.shape(key_positions)[0])
        return ops.concatenate([ops.broadcast_to(mask, shape) for mask in masks], axis=1)

    def get_config(self):
        config = super().get_config()
        config["patterns"] = [keras.saving.serialize_keras_object(p) for p in self.patterns]
        return config
