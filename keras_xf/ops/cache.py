"""Writing keys and values into an attention cache `[B, 2, L, Hkv, Dh]`."""

import contextlib
import threading

import keras
from keras import ops

_state = threading.local()


@contextlib.contextmanager
def cache_updates_in_place():
    """Within this context, on PyTorch, `update_cache` writes into the cache it is given
    instead of returning an updated copy.

    The decoding loop of `generate` uses it while it records its TorchScript step: the loop
    owns its cache and never reads an old one again, and a copy of every layer's cache at
    every step would cost more memory traffic than the step's arithmetic at batch 8. Outside
    this context (and on TensorFlow and JAX, where XLA updates loop buffers in place itself)
    `update_cache` is the functional `keras.ops.slice_update` of DESIGN.md.
    """
    previous = getattr(_state, "in_place", False)
    _state.in_place = True
    try:
        yield
    finally:
        _state.in_place = previous


def update_cache(cache, update, index):
    """`cache` with `update` `[B, 2, t, Hkv, Dh]` written at positions `index … index+t−1`.

    Args:
        cache: `[B, 2, L, Hkv, Dh]`.
        update: keys and values of `t` new positions, in the cache's dtype.
        index: int or int scalar tensor, the first position written.
    """
    if getattr(_state, "in_place", False) and keras.config.backend() == "torch":
        import torch

        positions = torch.arange(update.shape[2], device=cache.device) + torch.as_tensor(
            index, device=cache.device
        ).to(torch.int64)
        return cache.index_copy_(2, positions, update)
    return ops.slice_update(cache, (0, 0, index, 0, 0), update)
