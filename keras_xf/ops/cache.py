"""Writing keys and values into a head-major attention cache."""

import keras
from keras import ops

from keras_xf.ops.backend_specific import write_cache_in_place
from keras_xf.ops.backend_specific import writes_cache_in_place


def update_cache(cache, update, index):
    """`cache` with `update` written at positions `index … index+t−1` of axis 2.

    `cache` is one tensor `[B, Hkv, L, d]` or a structure of them (the `(keys, values)` pair
    of `MultiHeadAttention`), `update` the same structure with `t` positions. The functional
    `keras.ops.slice_update` of DESIGN.md, or an in-place write within
    `cache_updates_in_place` on PyTorch (`keras_xf.ops.backend_specific`).

    Args:
        cache: `[B, Hkv, L, d]`, or a structure of them.
        update: keys or values of `t` new positions, `[B, Hkv, t, d]`, cast to the cache's
            dtype here.
        index: int or int scalar tensor, the first position written.
    """
    return keras.tree.map_structure(
        lambda part, new: _write(part, ops.cast(new, part.dtype), index), cache, update
    )


def _write(cache, update, index):
    if writes_cache_in_place():
        return write_cache_in_place(cache, update, index)
    return ops.slice_update(cache, (0, 0, index, 0), update)
