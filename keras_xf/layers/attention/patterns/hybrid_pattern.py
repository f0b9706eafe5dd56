"""Union of attention fields (survey §5.1, hybrid methods: local + global + random)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.attention.patterns._validation import as_rank4
from keras_xf.layers.attention.patterns._validation import call_pattern
from keras_xf.layers.attention.patterns._validation import deserialize_patterns


@keras.saving.register_keras_serializable(package="keras_xf")
class HybridPattern(AttentionPattern):
    """The union of several attention fields: `π_i = π_i^(1) ∪ π_i^(2) ∪ …`.

    Survey §5.1 (hybrid methods): combining the fields of several sparse models, as BigBird
    combines local, global and random attention, keeps the model sparse while letting it
    look at the sequence from several perspectives. The masks of `patterns` are joined by
    logical or. The union uses the projected states when one of its patterns does, and
    supports cached decoding when all of them do.

    Args:
        patterns: non-empty list of `AttentionPattern` layers (or their serialised configs).
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.
        query: `[B, T, H, Dh]`, key: `[B, S, Hkv, Dh]`, passed on to patterns using states.

    Returns:
        Boolean `[B|1, H|1, T, S]`.

    Example:
    >>> pattern = HybridPattern([DilatedPattern(window=2), GlobalPattern(num_global=1),
    ...                          RandomPattern(num_random=2, max_length=16, seed=0)])
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    def __init__(self, patterns, **kwargs):
        super().__init__(**kwargs)
        self.patterns = deserialize_patterns(patterns, "patterns")
        self.uses_states = any(p.uses_states for p in self.patterns)
        self.supports_decoding = all(p.supports_decoding for p in self.patterns)

    def build(self, input_shape=None):
        for pattern in self.patterns:
            if not pattern.built:
                pattern.build(input_shape)
        self.built = True

    def call(self, query_positions, key_positions, query=None, key=None):
        mask = None
        for pattern in self.patterns:
            part = as_rank4(call_pattern(pattern, query_positions, key_positions, query, key))
            mask = part if mask is None else ops.logical_or(mask, part)
        return mask

    def get_config(self):
        config = super().get_config()
        config["patterns"] = [keras.saving.serialize_keras_object(p) for p in self.patterns]
        return config
