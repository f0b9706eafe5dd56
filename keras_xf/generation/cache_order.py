"""Which decoder caches generation must write in order, read from the layers of a stack."""

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


def _mixers(stack):
    return [layer for layer in sublayers(stack) if isinstance(layer, SequenceMixer)]
