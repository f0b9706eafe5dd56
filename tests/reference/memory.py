"""Numpy oracle for survey §5.2.1: Transformer-XL's chunk recurrence.

Each chunk `x_k` attends, causally, over the window `[m_k ; x_k]`, where the memory `m_k` is
the last `M` positions of the previous window (the inputs of the layer, held fixed); the
chunk's outputs are the window's last `T` rows. Written in float64 from the equations.
"""

import numpy as np

from tests.reference.attention import causal_mask
from tests.reference.attention import multi_head_attention


def memory_attention(chunks, weights, num_heads, memory_length, padding_masks=None,
                     num_key_value_heads=None):
    """The outputs of every chunk `[B, T, d]` of `chunks`, and the last memory and its mask.

    `padding_masks`: one boolean `[B, T]` per chunk (`None`: all valid). The first memory is
    empty (no valid position)."""
    batch, _, width = chunks[0].shape
    memory = np.zeros((batch, memory_length, width))
    valid = np.zeros((batch, memory_length), bool)
    outputs = []
    for index, chunk in enumerate(chunks):
        chunk_valid = (np.ones(chunk.shape[:2], bool) if padding_masks is None
                       else np.asarray(padding_masks[index], bool))
        window = np.concatenate([memory, np.asarray(chunk, np.float64)], axis=1)
        window_valid = np.concatenate([valid, chunk_valid], axis=1)
        length = window.shape[1]
        mask = causal_mask(length)[None, None] & window_valid[:, None, None, :]
        out, _ = multi_head_attention(window, window, weights, num_heads, num_key_value_heads,
                                      mask=mask)
        outputs.append(out[:, memory_length:])
        memory, valid = window[:, -memory_length:], window_valid[:, -memory_length:]
    return outputs, memory, valid
