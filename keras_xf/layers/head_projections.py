"""The per-head projections of attention-like mixers: `x W` with `W [d, H, Dh]` into heads, and
`Merge(C₁ … C_τ) W_c` with `W_c [H, Dh, d]` out of them (survey §2.3).

Shared by `MultiHeadAttention` (and its subclasses) and `LinearAttention`.
"""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer

INTO_HEADS = "btd,dhk->bthk"
OUT_OF_HEADS = "bthk,hkd->btd"


def head_projection(name, equation, output_shape, bias_axes, *, use_bias, kernel_initializer,
                    bias_initializer, dtype):
    """An `EinsumDense` with `equation` (`INTO_HEADS` or `OUT_OF_HEADS`) and fresh copies of
    the initializers (so that equal-shaped kernels do not share a seed)."""
    return keras.layers.EinsumDense(
        equation,
        output_shape=output_shape,
        bias_axes=bias_axes if use_bias else None,
        kernel_initializer=clone_initializer(kernel_initializer),
        bias_initializer=clone_initializer(bias_initializer),
        dtype=dtype,
        name=name,
    )


def project(dense, inputs):
    """`dense(inputs)` for a `head_projection`, computed as one matmul over the flattened head
    axes: the same numbers, without the reshapes and dispatch of a general einsum (which cost
    more than the arithmetic when decoding one token on PyTorch). The equation follows from
    the rank of `inputs`: 3 `[B, T, d]` into heads, 4 `[B, T, H, Dh]` out of them. LoRA-enabled
    or quantised projections are called as they are. Call it inside the owning layer's `call`
    (whose autocast scope gives the kernel in the compute dtype)."""
    if dense.lora_enabled or dense.quantization_mode:
        return dense(inputs)
    kernel = dense.kernel
    batch_shape = ops.shape(inputs)[:2]
    if len(inputs.shape) == 4:  # OUT_OF_HEADS
        flat = ops.reshape(inputs, (batch_shape[0], batch_shape[1], -1))
        outputs = ops.matmul(flat, ops.reshape(kernel, (-1, kernel.shape[-1])))
    else:  # INTO_HEADS
        heads, dim = kernel.shape[1], kernel.shape[2]
        outputs = ops.matmul(inputs, ops.reshape(kernel, (kernel.shape[0], heads * dim)))
        outputs = ops.reshape(outputs, (batch_shape[0], batch_shape[1], heads, dim))
    if dense.bias is not None:
        outputs = outputs + dense.bias
    return outputs
