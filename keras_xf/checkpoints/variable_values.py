"""The first value of a variable loaded from a checkpoint tensor, made in as few passes over
its bytes as the backend allows."""

import mmap
import warnings

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


def c_ordered_permutation(value):
    """The axes of `value` from its slowest to its fastest in memory, when `value` is a
    permutation of a C-ordered block (such as a transposed `torch.nn.Linear` weight, or one
    split into heads), else `None`. `value.transpose(permutation)` is then C-ordered."""
    permutation = tuple(int(a) for a in np.argsort([-abs(s) for s in value.strides],
                                                   kind="stable"))
    if any(s < 0 for s in value.strides) or not value.transpose(permutation).flags.c_contiguous:
        return None
    return permutation


def _native(dtype):
    """Whether `dtype` is one of NumPy's own numeric types (not an `ml_dtypes` extension such
    as bfloat16, which the backends' NumPy bridges do not all take)."""
    return np.dtype(dtype).kind in "fiu"


def _transposed_by_backend(value, dtype):
    """`value` (a strided view) in C order of `dtype`, copied by the backend's own
    transposition, or `None` where it has none for this view. PyTorch's and TensorFlow's
    transposing copies (blocked, and on all cores) run two to three times faster than
    `c_ordered_copy`'s tiles, which NumPy copies one at a time. JAX has none here: its
    transposition is as fast only when `device_put` keeps the file mapping as its buffer,
    and the mapped pages then stay resident beside the weights."""
    backend = keras.config.backend()
    permutation = c_ordered_permutation(value)
    if (permutation is None or permutation == tuple(range(value.ndim))
            or not _native(value.dtype)):
        return None
    if backend == "torch" and _native(dtype):
        import torch

        result = torch.empty(value.shape, dtype=getattr(torch, dtype))
        with warnings.catch_warnings():  # read-only source: only read here
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            result.copy_(torch.from_numpy(value))
        return result
    if backend == "tensorflow":
        import tensorflow as tf

        inverse = tuple(int(a) for a in np.argsort(permutation))
        block = value.transpose(permutation)  # C-ordered: a view, which `constant` copies
        return tf.cast(tf.transpose(tf.constant(block), inverse), dtype)
    return None


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

    Each backend gets the tensor in one copy of its own, made in C order, never NumPy's
    strided copy. On PyTorch and TensorFlow a transposed view of NumPy numbers is
    transposed by the backend itself (`_transposed_by_backend`); other views are copied in
    tiles (`c_ordered_copy`). Then: PyTorch, which keeps the memory
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
    if not private:
        transposed = _transposed_by_backend(value, dtype)
        if transposed is not None:
            return transposed
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
