"""The rolling key/value cache of banded attention patterns (survey §5.1)."""

from keras import ops

from keras_xf.layers.attention.caches.full_cache import FullCache
from keras_xf.ops.cache import update_cache


class RollingCache(FullCache):
    """A cache of `slots` positions for a pattern whose queries see at most the last `slots`
    keys (`LocalPattern` and the other banded patterns declare `cache_slots`): slot
    `p mod slots` holds position `p`, and keys are masked by their absolute positions. The
    layout is `FullCache`'s with `slots` in place of `max_length`, so memory stays `O(slots)`
    whatever the length generated. Writes must come in order (each call at the next position,
    or repeating the latest one), as `generate` does.

    Args:
        slots: int, the number of positions held.
    """

    # A slot holds whichever position came last: masks over positions cannot index it, and
    # the keys are not in position order.
    takes_masks = False
    reads_in_place = False

    def __init__(self, slots):
        self.slots = slots

    def allocate(self, batch_size, max_length, kv_heads, key_dim, value_dim, dtype):
        """`FullCache.allocate` with `min(max_length, slots)` positions."""
        return super().allocate(batch_size, min(max_length, self.slots), kv_heads, key_dim,
                                value_dim, dtype)

    def holds(self, cache):
        """Whether `cache` is one of this kind: exactly `slots` positions long."""
        return cache[0].shape[2] == self.slots

    def key_length(self, cache, query_length):
        """One new token attends to the slots; a prompt of `T` tokens to the slots and its own
        `T` keys."""
        if query_length == 1:
            return self.slots
        return None if query_length is None else self.slots + query_length

    def describe(self, cache):
        return f"the rolling cache of {self.slots} slots"

    def check_masks(self, padding_mask, attention_mask):
        """A rolling cache refuses both masks: its slots are not in position order."""
        if padding_mask is not None or attention_mask is not None:
            raise ValueError(
                "A rolling cache holds keys by position modulo its size: padding_mask and "
                "attention_mask cannot index it. Received: padding_mask="
                f"{padding_mask is not None}, attention_mask={attention_mask is not None}"
            )

    def write(self, cache, key, value, offset, query_length):
        """Writes `t` new keys and values into the slots.

        One token is written first with `update_cache` (a `slice_update` at `offset mod
        slots`), then the query attends to the slots, each at its absolute position. Several
        tokens (a prompt) attend to the old slots followed by the new keys, and the newest
        token of each slot is written afterwards. Returns as `FullCache.write`; keys outside
        `[0, offset + t)` are invalid.
        """
        slots = self.slots
        length = key.shape[1]
        update = tuple(ops.cast(part, cache[0].dtype) for part in self.entry(key, value))
        slot_ids = ops.arange(slots, dtype="int32")
        end = offset + ops.shape(key)[1]
        if length == 1:
            new_cache = update_cache(cache, update, ops.mod(offset, slots))
            attended = new_cache
            key_positions = offset - ops.mod(offset - slot_ids + slots, slots)
        else:
            last = end - 1
            newest = last - ops.mod(last - slot_ids + slots, slots)
            index = ops.clip(newest - offset, 0, ops.shape(key)[1] - 1)
            new_cache = tuple(
                ops.where((newest >= offset)[None, None, :, None], ops.take(new, index, axis=2),
                          old)
                for old, new in zip(cache, update)
            )
            attended = tuple(ops.concatenate([old, new], axis=2) for old, new in zip(cache, update))
            old_positions = offset - 1 - ops.mod(offset - 1 - slot_ids + slots, slots)
            key_positions = ops.concatenate(
                [old_positions, ops.arange(ops.shape(key)[1], dtype="int32") + offset]
            )
        valid_keys = ops.logical_and(key_positions >= 0, key_positions < end)[None, :]
        return new_cache, attended, key_positions, valid_keys


def cache_kind(pattern, cache=None, cache_index=None, value=None):
    """The kind of cache a `MultiHeadAttention` with `pattern` makes (no `cache`) or that a
    call writes or reads: a `RollingCache` of the pattern's `cache_slots` for self-attention
    decoding into a cache of exactly that many slots, else a `FullCache`."""
    slots = None if pattern is None else pattern.cache_slots
    if slots is not None:
        rolling = RollingCache(slots)
        if cache is None or (cache_index is not None and value is None and rolling.holds(cache)):
            return rolling
    return FullCache()
