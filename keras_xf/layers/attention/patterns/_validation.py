"""Argument checks and mask helpers shared by the attention patterns."""

import numpy as np

from keras_xf.ops.attention import repeat_kv_heads
from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.cloning import as_layer
from keras_xf.ops.masks import expand_attention_mask


def draw_seed(seed):
    """The seed itself, or a fresh one drawn from the operating system's entropy."""
    return int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else seed


def as_rank4(mask):
    """A boolean pattern mask of rank 2, 3 or 4 brought to `[B|1, H|1, T, S]`."""
    return expand_attention_mask(mask)


def deserialize_patterns(patterns, argument):
    if not isinstance(patterns, (list, tuple)) or not patterns:
        raise ValueError(
            f"{argument} must be a non-empty list of AttentionPattern layers. "
            f"Received: {argument}={patterns}"
        )
    return [as_layer(pattern, f"{argument}[{index}]", kind=AttentionPattern)
            for index, pattern in enumerate(patterns)]


def call_pattern(pattern, query_positions, key_positions, query, key):
    if pattern.uses_states:
        return pattern(query_positions, key_positions, query=query, key=key)
    return pattern(query_positions, key_positions)


def key_heads_like_query(query, key):
    """Repeats the `Hkv` key heads of grouped-query attention to the `H` query heads."""
    return repeat_kv_heads(key, query.shape[2])
