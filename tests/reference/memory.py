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


def _pool(states, valid, compression, rate):
    """Slots `[B, ⌈T / rate⌉, d]` and their counts from the positions `states [B, T, d]`
    (the last group shorter when `rate` does not divide `T`)."""
    batch, length, width = states.shape
    groups = -(-length // rate)
    slots = np.zeros((batch, groups, width))
    counts = np.zeros((batch, groups))
    for b in range(batch):
        for g in range(groups):
            members = [states[b, t] for t in range(g * rate, min((g + 1) * rate, length))
                       if valid[b, t]]
            counts[b, g] = len(members)
            if members:
                slots[b, g] = (np.mean(members, axis=0) if compression == "mean"
                               else np.max(members, axis=0))
    return slots, counts


def compressive_memory_attention(chunks, weights, num_heads, memory_length, compressed_length,
                                 compression, rate, padding_masks=None):
    """Survey §5.2.2: each chunk attends causally over `[c ; m ; x]`; the `T` oldest positions
    of `[m ; x]` leave the local memory and enter the long-term memory `c`, pooled in groups
    of `rate` (`"mean"`, `"max"`: the latest `N` slots kept) or averaged into one slot with
    every position let go before (`"running_mean"`: `k̄ = Σ k_j / (i − 1)`, computed here as
    the mean of the whole list of positions let go, not incrementally).

    Returns the outputs of every chunk, and the last `(memory, valid, compressed, counts)`."""
    batch, _, width = chunks[0].shape
    memory = np.zeros((batch, memory_length, width))
    valid = np.zeros((batch, memory_length), bool)
    compressed = np.zeros((batch, compressed_length, width))
    counts = np.zeros((batch, compressed_length))
    let_go = [[] for _ in range(batch)]  # every valid position let go, for the running mean
    outputs = []
    for index, chunk in enumerate(chunks):
        length = chunk.shape[1]
        chunk_valid = (np.ones(chunk.shape[:2], bool) if padding_masks is None
                       else np.asarray(padding_masks[index], bool))
        raw = np.concatenate([memory, np.asarray(chunk, np.float64)], axis=1)
        raw_valid = np.concatenate([valid, chunk_valid], axis=1)
        window = np.concatenate([compressed, raw], axis=1)
        window_valid = np.concatenate([counts > 0, raw_valid], axis=1)
        mask = causal_mask(window.shape[1])[None, None] & window_valid[:, None, None, :]
        out, _ = multi_head_attention(window, window, weights, num_heads, 1, mask=mask)
        outputs.append(out[:, compressed_length + memory_length:])
        evicted, evicted_valid = raw[:, :length], raw_valid[:, :length]
        if compression == "running_mean":
            for b in range(batch):
                let_go[b].extend(evicted[b, t] for t in range(length) if evicted_valid[b, t])
                counts[b, 0] = len(let_go[b])
                compressed[b, 0] = np.mean(let_go[b], axis=0) if let_go[b] else 0.0
        else:
            slots, slot_counts = _pool(evicted, evicted_valid, compression, rate)
            compressed = np.concatenate([compressed, slots], axis=1)[:, -compressed_length:]
            counts = np.concatenate([counts, slot_counts], axis=1)[:, -compressed_length:]
        memory, valid = raw[:, -memory_length:], raw_valid[:, -memory_length:]
    return outputs, memory, valid, compressed, counts


def retrieval_memory_attention(chunks, local_weights, retrieval_weights, gate, num_heads,
                               memory_length, top_k, padding_masks=None):
    """Survey §5.2.3: each chunk's local causal attention `L`, joined with `R`, each query's
    attention over the `top_k` pairs of the memory of highest `q·k` (the memory being the `S`
    positions before the chunk, held fixed), as `C = L + σ(g)(R − L)` (`L` for a row whose
    memory is empty).

    Returns the outputs of every chunk and the last `(memory, valid)`."""
    from tests.reference.compressed import compressed_attention

    batch, _, width = chunks[0].shape
    memory = np.zeros((batch, memory_length, width))
    valid = np.zeros((batch, memory_length), bool)
    sigma = 1.0 / (1.0 + np.exp(-np.asarray(gate, np.float64)))
    outputs = []
    for index, chunk in enumerate(chunks):
        chunk = np.asarray(chunk, np.float64)
        chunk_valid = (np.ones(chunk.shape[:2], bool) if padding_masks is None
                       else np.asarray(padding_masks[index], bool))
        mask = causal_mask(chunk.shape[1])[None, None] & chunk_valid[:, None, None, :]
        local, _ = multi_head_attention(chunk, chunk, local_weights, num_heads, mask=mask)
        retrieved, _ = compressed_attention(chunk, memory, retrieval_weights, num_heads,
                                            "selection", None, padding_mask=valid,
                                            compressed_length=top_k)
        found = valid.any(axis=1)[:, None, None]
        outputs.append(np.where(found, local + sigma * (retrieved - local), local))
        memory = np.concatenate([memory, chunk], axis=1)[:, -memory_length:]
        valid = np.concatenate([valid, chunk_valid], axis=1)[:, -memory_length:]
    return outputs, memory, valid
