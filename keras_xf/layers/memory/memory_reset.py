"""Emptying every carried memory of a model at once."""

from keras_xf.layers.memory.memory_attention import MemoryAttention
from keras_xf.ops.keras_internals import sublayers


def reset_memories(layer):
    """Empties the memories of every stateful `MemoryAttention` (and subclass:
    `CompressiveMemoryAttention`, `RetrievalMemoryAttention`) inside `layer` (a model, a
    stack or a block), as at the start of a stream; returns how many were reset.

    Example:
    >>> reset_memories(model)  # before evaluating on a new stream
    """
    mixers = [sub for sub in sublayers(layer, include_self=True)
              if isinstance(sub, MemoryAttention) and sub.stateful]
    for mixer in mixers:
        mixer.reset_memory()
    return len(mixers)
