"""The first value of a variable loaded from a checkpoint tensor, made in as few passes over
its bytes as the backend allows."""

import mmap

import keras
import numpy as np

# Side of the square tiles in which `c_ordered_copy` transposes: two tiles of float32 stay
# in the first-level cache.
_TILE = 48


def c_ordered_copy(value, dtype, result=None):
    """A new C-ordered array of `dtype` with `value`'s elements (written into `result`, an
    empty C-ordered array of that shape and dtype, when given). A `torch.nn.Linear` weight
    read as a kernel is a transposed view: NumPy's element-by-element copy of it strides
    through memory, so it is copied in square tiles of its fastest and its last axis."""
    sizes = [abs(stride) if size > 1 else np.inf
             for stride, size in zip(value.strides, value.shape)]
    fastest, last = int(np.argmin(sizes)) if sizes else 0, value.ndim - 1
    if result is None:
        result = np.empty(value.shape, dtype)
    if value.ndim < 2 or fastest == last or value.shape[last] == 1:
        np.copyto(result, value, casting="unsafe")
        return result
    value = value.view(np.ndarray)  # a plain view: a `np.memmap`'s slicing is slower
    others = [axis for axis in range(value.ndim) if axis not in (fastest, last)]
    for index in np.ndindex(*[value.shape[axis] for axis in others]):
        tile = [slice(None)] * value.ndim
        for axis, position in zip(others, index):
            tile[axis] = position
        for i in range(0, value.shape[fastest], _TILE):
            tile[fastest] = slice(i, i + _TILE)
            for j in range(0, value.shape[last], _TILE):
                tile[last] = slice(j, j + _TILE)
                result[tuple(tile)] = value[tuple(tile)]
    return result


def _unpaged_empty(shape, dtype):
    """An empty C-ordered array in an anonymous mapping of its own: page-aligned, and without
    the transparent huge pages that NumPy's allocator asks for (their faults cost the kernel
    more than the copy that fills them)."""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    return np.frombuffer(buffer, dtype, count=count).reshape(shape)


def variable_value(value, dtype, sources=()):
    """What to give a variable of `dtype` as its first value so that it holds its own copy
    of the NumPy array `value`, which may be a strided view of the arrays `sources` (read-only
    file mappings).

    Each backend gets the tensor in one copy of its own, made in C order (a transposed view
    in tiles, `c_ordered_copy`), never NumPy's strided copy: PyTorch, which keeps the memory
    of the tensor it is given, a tensor from its own allocator filled in place; TensorFlow,
    whose conversion of a NumPy array copies it again, a page-aligned buffer passed through
    DLPack without a copy; JAX, which on the CPU keeps an array aligned to 64 bytes as its
    buffer instead of copying it (even a read-only file mapping, and even when told
    `may_alias=False`), a private C-ordered array (`jax.device_put`, which then copies it or
    keeps it). bfloat16 arrays, which DLPack and `torch.from_numpy` do not take, go to
    PyTorch and TensorFlow as NumPy arrays.
    """
    dtype = keras.backend.standardize_dtype(dtype)
    backend = keras.config.backend()
    ordered = value.flags.c_contiguous and keras.backend.standardize_dtype(value.dtype) == dtype
    private = ordered and value.flags.writeable and not any(
        np.may_share_memory(value, source) for source in sources)
    if backend == "torch" and dtype != "bfloat16":
        import torch

        if private:
            return torch.from_numpy(value)
        result = torch.empty(value.shape, dtype=getattr(torch, dtype))
        c_ordered_copy(value, dtype, result.numpy())
        return result
    if backend == "tensorflow" and dtype != "bfloat16":
        import tensorflow as tf

        result = c_ordered_copy(value, dtype, _unpaged_empty(value.shape, dtype))
        return tf.experimental.dlpack.from_dlpack(result.__dlpack__())
    if backend == "jax":
        import jax

        return jax.device_put(value if private else c_ordered_copy(value, dtype))
    return value if private else c_ordered_copy(value, dtype)
