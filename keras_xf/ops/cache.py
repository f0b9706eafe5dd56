"""Writing keys and values into a head-major attention cache `[B, 2, Hkv, L, Dh]`."""

from keras import ops

from keras_xf.ops.backend_specific import write_cache_in_place
from keras_xf.ops.backend_specific import writes_cache_in_place


def update_cache(cache, update, index):
    """`cache` with `update` `[B, 2, Hkv, t, Dh]` written at positions `index … index+t−1`.

    The functional `keras.ops.slice_update` of DESIGN.md, or an in-place write within
    `cache_updates_in_place` on PyTorch (`keras_xf.ops.backend_specific`).

    Args:
        cache: `[B, 2, Hkv, L, Dh]`.
        update: keys and values of `t` new positions, in the cache's dtype.
        index: int or int scalar tensor, the first position written.
    """
    if writes_cache_in_place():
        return write_cache_in_place(cache, update, index)
    return ops.slice_update(cache, (0, 0, 0, index, 0), update)
