"""Which decoder caches generation must write in order, and whether it may decode without
one, read from the layers of a stack."""

from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.keras_internals import sublayers


def keeps_recurrent_state(stack):
    """Whether a mixer of `stack` keeps a recurrent state (`cache_is_recurrent`): a fixed-size
    state each call advances, which must see every token once, rather than a cache addressed
    by position, which may be written twice."""
    return any(mixer.cache_is_recurrent for mixer in _mixers(stack))


def writes_cache_in_order(stack):
    """Whether a mixer's cache must be written in order, no position ahead of the one decoded
    next: a recurrent state, or a rolling cache that keeps only the latest positions
    (`cache_is_rolling`)."""
    return any(mixer.cache_is_recurrent or mixer.cache_is_rolling for mixer in _mixers(stack))


def check_use_cache(use_cache, stack):
    """`use_cache` must be a bool, and `True` where a mixer of `stack` carries a memory from
    call to call (`carries_memory`): the full passes of uncached decoding would each advance
    it, while cached decoding reads it and leaves it."""
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be a bool. Received: use_cache={use_cache!r}")
    carriers = [type(m).__name__ for m in _mixers(stack) if m.carries_memory]
    if carriers and not use_cache:
        raise ValueError(
            f"This model carries a memory between calls ({carriers[0]}): every full pass of "
            "uncached decoding would advance it. Generate with the cache, which reads the "
            "memory and leaves it. Received: use_cache=False"
        )


def _mixers(stack):
    return [layer for layer in sublayers(stack) if isinstance(layer, SequenceMixer)]
