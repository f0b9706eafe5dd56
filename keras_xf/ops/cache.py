"""Writing keys and values into a head-major attention cache.

`update_cache` is the functional write of DESIGN.md (`keras.ops.slice_update`), except in a
TorchScript trace, where it records an in-place write (`write_cache_in_place`): backend-specific
code kept beside the cache it writes.
"""

import keras
from keras import ops


def update_cache(cache, update, index):
    """`cache` with `update` written at positions `index … index+t−1` of axis 2.

    `cache` is one tensor `[B, Hkv, L, d]` or a structure of them (the `(keys, values)` pair
    of `MultiHeadAttention`), `update` the same structure with `t` positions. The functional
    `keras.ops.slice_update`, or an in-place write where `records_in_place_writes` says so.

    Args:
        cache: `[B, Hkv, L, d]`, or a structure of them.
        update: keys or values of `t` new positions, `[B, Hkv, t, d]`, cast to the cache's
            dtype here.
        index: int or int scalar tensor, the first position written.
    """
    in_place = records_in_place_writes()
    return keras.tree.map_structure(
        lambda part, new: _write(part, ops.cast(new, part.dtype), index, in_place), cache, update
    )


def _write(cache, update, index, in_place):
    if in_place:
        return write_cache_in_place(cache, update, index)
    return ops.slice_update(cache, (0, 0, index, 0), update)


def records_in_place_writes():
    """Whether `update_cache` writes in place: on PyTorch, while `torch.jit.trace` records the
    write (`torch.jit.is_tracing()`, the tracer's own declared state).

    Why not `keras.ops.slice_update` there: it is functional (a new tensor), and PyTorch has no
    compiler that turns it into an in-place write. The one TorchScript trace keras_xf records
    is the step of its decoding loop (`keras_xf.generation`), whose replays write the caches
    the loop passes in: the loop owns its cache and never reads an old one again, and a copy of
    every layer's cache at every step costs more memory traffic than the step's arithmetic at
    small batch sizes. Eager calls, `torch.export` programs and the other backends keep the
    functional write (on TensorFlow and JAX, XLA updates loop buffers in place itself).
    """
    if keras.config.backend() != "torch":
        return False
    import torch

    return torch.jit.is_tracing()


def write_cache_in_place(cache, update, index):
    """`cache[:, :, index : index + t] = update` in place (PyTorch's `index_copy_`), returning
    `cache`: `keras.ops` has no in-place write (see `records_in_place_writes`). A cache that
    is a broadcast view (stride 0, e.g. one row repeated for the beams of a beam search) is
    copied into memory of its own first, once: several of its elements share one location."""
    import torch

    if any(stride == 0 and size > 1 for stride, size in zip(cache.stride(), cache.shape)):
        cache = cache.contiguous()

    positions = torch.arange(update.shape[2], device=cache.device) + torch.as_tensor(
        index, device=cache.device
    ).to(torch.int64)
    return cache.index_copy_(2, positions, update)
