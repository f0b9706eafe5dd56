"""The per-head projections of attention-like mixers: `x W` with `W [d, H, Dh]` into heads, and
`Merge(C₁ … C_τ) W_c` with `W_c [H, Dh, d]` out of them (survey §2.3).

Shared by `MultiHeadAttention` (and its subclasses) and `LinearAttention`.
"""

from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.lora.lora_einsum_dense import LoRAEinsumDense

INTO_HEADS = "btd,dhk->bthk"
OUT_OF_HEADS = "bthk,hkd->btd"


def head_projection(name, equation, output_shape, bias_axes, *, use_bias, kernel_initializer,
                    bias_initializer, dtype):
    """An `EinsumDense` with `equation` (`INTO_HEADS` or `OUT_OF_HEADS`) and fresh copies of
    the initializers (so that equal-shaped kernels do not share a seed); a `LoRAEinsumDense`,
    so that LoRA adapters survive a `.keras` save."""
    return LoRAEinsumDense(
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


def fusable(denses):
    """Whether `project_fused(denses, inputs)` applies: plain kernels (no LoRA, not
    quantised; those are called as they are), one kernel dtype, and a bias in all or none."""
    return bool(
        not any(dense.lora_enabled or dense.quantization_mode for dense in denses)
        and len({dense.kernel.dtype for dense in denses}) == 1
        and len({dense.bias is None for dense in denses}) == 1
    )


def project_fused(denses, inputs):
    """`[project(dense, inputs) for dense in denses]` as ONE matmul for `INTO_HEADS`
    projections of the same `[B, T, d]` inputs: `x [W_q | W_k | W_v] + [b_q | b_k | b_v]`,
    split along the output axis (the widths may differ, as in GQA/MQA). The variables stay
    separate (checkpoint loaders, quantisation, sharding and saved files see the three
    kernels); the concatenation is a `d × ΣHDh` copy per call against a `BT·d·ΣHDh` product.
    Call it only where `fusable(denses)`, inside the owning layer's `call`."""
    shapes = [(dense.kernel.shape[1], dense.kernel.shape[2]) for dense in denses]
    widths = [heads * dim for heads, dim in shapes]
    kernel = ops.concatenate(
        [ops.reshape(dense.kernel, (dense.kernel.shape[0], width))
         for dense, width in zip(denses, widths)],
        axis=-1,
    )
    outputs = ops.matmul(inputs, kernel)
    if denses[0].bias is not None:
        outputs = outputs + ops.concatenate(
            [ops.reshape(dense.bias, (width,)) for dense, width in zip(denses, widths)]
        )
    batch_shape = ops.shape(inputs)[:2]
    splits = [sum(widths[: index + 1]) for index in range(len(widths) - 1)]
    return [
        ops.reshape(part, (batch_shape[0], batch_shape[1], heads, dim))
        for part, (heads, dim) in zip(ops.split(outputs, splits, axis=-1), shapes)
    ]
