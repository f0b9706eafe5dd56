"""The full key/value cache of `MultiHeadAttention` (survey §2.3, §5.4)."""

from keras import ops

from keras_xf.ops.cache import update_cache
from keras_xf.ops.checks import is_array
from keras_xf.ops.checks import static_dim


class FullCache:
    """The full cache: the head-major pair `(keys [B, Hkv, L, d′], values [B, Hkv, L, Dh])`
    with room for `L = max_length` positions, position `p` in slot `p`.

    Decoding reads every cached key at every step; head-major, each head's keys are the
    contiguous operand of its `q·kᵀ` product, and two tensors (not one stacked tensor) make
    each an operand without a slice copy. A kind holds no tensors: `MultiHeadAttention`
    chooses one per call and the cache stays the pair of tensors `allocate` made.
    """

    # Whether a call writing into this kind may take a padding_mask and an attention_mask.
    takes_masks = True
    # Whether attention may read the cache in its own head-major layout, keys in position order.
    reads_in_place = True

    def allocate(self, batch_size, max_length, kv_heads, key_dim, value_dim, dtype):
        """Zero keys `[batch_size, kv_heads, max_length, key_dim]` and values
        `[…, value_dim]` in `dtype`."""
        shape = (batch_size, kv_heads, max_length)
        return ops.zeros(shape + (key_dim,), dtype=dtype), ops.zeros(shape + (value_dim,), dtype=dtype)

    @staticmethod
    def check(cache):
        """A `MultiHeadAttention` cache is the pair `(keys, values)` of `init_cache`."""
        if cache is None:
            return
        if not isinstance(cache, (tuple, list)) or len(cache) != 2 or not all(
            is_array(part) and len(part.shape) == 4 for part in cache
        ):
            if is_array(cache):
                received = f"a tensor of shape {tuple(cache.shape)}"
            else:
                entries = len(cache) if isinstance(cache, (tuple, list)) else "?"
                received = f"{type(cache).__name__} of {entries} entries"
            raise ValueError(
                "cache must be the pair (keys [B, Hkv, L, d], values [B, Hkv, L, d]) of "
                f"init_cache. Received: {received}"
            )

    @staticmethod
    def entry(key, value):
        """Keys `[B, S, Hkv, d′]` and values `[B, S, Hkv, Dh]` as the cache's head-major pair
        `(keys [B, Hkv, S, d′], values [B, Hkv, S, Dh])`, values in the keys' dtype."""
        return (ops.transpose(key, (0, 2, 1, 3)),
                ops.transpose(ops.cast(value, key.dtype), (0, 2, 1, 3)))

    @staticmethod
    def read(cache):
        """Keys and values of a cache as `[B, S, Hkv, ·]`, the layout of the attention ops."""
        return tuple(ops.transpose(part, (0, 2, 1, 3)) for part in cache)

    def check_masks(self, padding_mask, attention_mask):
        """Raises a `ValueError` for masks that a call writing into this kind cannot take
        (none here: a full cache is in position order)."""

    def fill(self, cache, key, value):
        """The cache of keys and values computed once (cross-attention to an encoder's
        outputs), in the dtype of `cache`."""
        return tuple(ops.cast(part, cache[0].dtype) for part in self.entry(key, value))

    @staticmethod
    def length(cache):
        """The number of positions `cache` holds (a scalar tensor where unknown)."""
        return ops.shape(cache[0])[2]

    def key_length(self, cache, query_length):
        """The number of keys a query attends to when it reads `cache` (static, or `None`)."""
        return static_dim(cache[0].shape[2])

    def describe(self, cache):
        """The keys a query attends to, for error messages."""
        return f"cache keys of shape {tuple(cache[0].shape)} (key_length = keys.shape[2])"

    def write(self, cache, key, value, offset, query_length):
        """Writes the keys and values of the positions `offset …` into `cache`.

        Returns `(new_cache, attended, key_positions, valid_keys)`: the cache to return, the
        head-major pair the queries attend to (here the new cache), the int32 position of
        each of its keys, and `[1, S]` the keys written so far (`p < offset + query_length`).
        """
        new_cache = update_cache(cache, self.entry(key, value), offset)
        key_positions = ops.arange(ops.shape(new_cache[0])[2], dtype="int32")
        valid_keys = ops.less(key_positions, offset + query_length)[None, :]
        return new_cache, new_cache, key_positions, valid_keys

