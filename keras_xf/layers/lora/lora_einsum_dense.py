"""A `keras.layers.EinsumDense` with LoRA adapters over its flattened matrix (Hu et al. 2021)."""

import keras
from keras import ops

from keras_xf.layers.lora.adapters import LoRAAdapters
from keras_xf.layers.lora.lora_saving import LoRASaving


def _kernel_axes(equation, kernel_shape):
    """`(input axes, output axes)` of the kernel: its leading axes, which the input carries
    last and in the same order, then the rest; a `ValueError` for another layout."""
    inputs, rest = equation.split(",")
    kernel = rest.split("->")[0]
    count = sum(1 for letter in kernel if letter in inputs)
    if count in (0, len(kernel)) or not inputs.endswith(kernel[:count]):
        raise ValueError(
            "LoRA needs an EinsumDense kernel whose leading axes are its inputs and whose last "
            f"are its outputs. Received: equation={equation!r}")
    return tuple(kernel_shape[:count]), tuple(kernel_shape[count:])


@keras.saving.register_keras_serializable(package="keras_xf")
class LoRAEinsumDense(LoRAAdapters, LoRASaving, keras.layers.EinsumDense):
    """`y = einsum(equation, x, W) + b`, and after `enable_lora(r, lora_alpha=α)`:
    `W + (α/r)·A·B` in place of `W`, the low-rank update of `W` seen as the matrix
    `[Π input axes, Π output axes]`: `A [*input axes, r]` random (He uniform), `B [r,
    *output axes]` zero, `W` frozen.

    For the attention projections into heads, `W [d, H, Dh]`, that is `A [d, r]`,
    `B [r, H, Dh]`: the update of the `[d, H·Dh]` matrix that PEFT's and the paper's LoRA
    learn on `q_proj`, `k_proj`, `v_proj` (Keras' own `EinsumDense.enable_lora` would learn
    one update per head, `A [d, H, r]`, `B [r, Dh]`, which no PEFT adapter expresses). Out
    of heads, `W [H, Dh, d]`: `A [H, Dh, r]`, `B [r, d]`.

    `kernel` is the merged kernel while the adapters exist, so the one-matmul paths of the
    attention layers (`head_projections.project`, the fused query/key/value product) compute
    with it and train `A` and `B` through it. A quantised kernel (`quantize`) keeps float
    adapters whose update `(α/r)·(x A) B` is added to the quantised product. Keras' own
    LoRA attributes (`lora_enabled`) stay off; `lora_adapters_enabled` says whether this
    layer's adapters exist (`LoRAAdapters`). A `.keras` file saves `W`, `A` and `B` apart
    (`LoRASaving`).

    Args:
        equation: str, the einsum equation (`"btd,dhk->bthk"`, `"bthk,hkd->btd"`, ...).
        output_shape: the output shape without the batch axis.
        **kwargs: `keras.layers.EinsumDense` arguments.

    Example:
    >>> dense = LoRAEinsumDense("btd,dhk->bthk", output_shape=(None, 2, 4))
    >>> dense.build((None, None, 8))
    >>> dense.enable_lora(2)
    >>> tuple(dense.lora_kernel_a.shape), tuple(dense.lora_kernel_b.shape)  # (8, 2), (2, 2, 4)
    >>> dense(np.ones((2, 3, 8), "float32")).shape  # B = 0: the output of W alone
    (2, 3, 2, 4)
    """

    def __init__(self, equation, output_shape, **kwargs):
        if not isinstance(equation, str) or "," not in equation or "->" not in equation:
            raise ValueError("equation must be an einsum equation of the inputs and the "
                             f"kernel, such as 'btd,dhk->bthk'. Received: equation={equation!r}")
        sizes = output_shape if isinstance(output_shape, (list, tuple)) else (output_shape,)
        if not sizes or not all(size is None or (isinstance(size, int) and not isinstance(
                size, bool) and size > 0) for size in sizes):
            raise ValueError("output_shape must be a positive int or a tuple of positive ints "
                             f"and None (a free axis). Received: output_shape={output_shape!r}")
        outputs = equation.split("->")[-1]
        if "." not in outputs and len(sizes) != len(outputs) - 1:
            raise ValueError(f"output_shape must give the {len(outputs) - 1} output axes after "
                             f"the batch axis of {outputs!r} in the equation {equation!r}. "
                             f"Received: output_shape={output_shape!r}")
        super().__init__(equation, output_shape, **kwargs)

    def build(self, input_shape):
        try:
            super().build(input_shape)
        except ValueError as error:
            raise ValueError(f"output_shape={self.partial_output_shape!r} does not fit inputs "
                             f"of shape {tuple(input_shape)} under the equation "
                             f"{self.equation!r}: {error}") from None

    def __call__(self, inputs, *args, **kwargs):
        # Checked here, before Keras' input spec, so the message names `inputs`: the rank of
        # the equation's input, and each input axis the kernel shares at its built size.
        letters = self.equation.split(",")[0]
        shape = tuple(inputs.shape)
        if "." not in letters and len(shape) != len(letters):
            raise ValueError(f"inputs must have rank {len(letters)} ({letters!r} in the "
                             f"equation {self.equation!r}). Received: inputs.shape={shape}")
        if self.built and "." not in letters:
            kernel = self.equation.split(",")[1].split("->")[0]
            sizes = (self.original_kernel_shape if self.quantization_mode == "int4"
                     else tuple(self._kernel.shape))
            for axis, letter in enumerate(letters):
                expected = sizes[kernel.index(letter)] if letter in kernel else None
                if expected is not None and shape[axis] is not None and (
                        shape[axis] != expected):
                    raise ValueError(f"inputs must have size {expected} on axis {axis} (the "
                                     f"kernel's {letter!r}). Received: inputs.shape={shape}")
        return super().__call__(inputs, *args, **kwargs)

    def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform",
                    b_initializer="zeros"):
        """Adds `A`, `B` (float32) and freezes `W`; raises a `ValueError` for a bad `rank`
        or `lora_alpha`, before the layer is built, with an activation (the update is added
        before it), or when the adapters exist already."""
        rank, lora_alpha = self._check_lora_settings(rank, lora_alpha)
        if self.activation not in (None, keras.activations.linear):
            raise ValueError(f"LoRA on '{self.name}' needs an EinsumDense without activation. "
                             f"Received: activation={self.activation}")
        shape = (tuple(self.original_kernel_shape) if self.quantization_mode == "int4"
                 else tuple(self._kernel.shape))
        inputs, outputs = _kernel_axes(self.equation, shape)
        self._add_lora_adapters(rank, lora_alpha, inputs + (rank,), (rank,) + outputs,
                                _flat_initializer(a_initializer, len(inputs)), b_initializer,
                                frozen=self._kernel)

    def lora_delta(self):
        """`(α/r)·A·B` with the kernel's shape (float32)."""
        a, b = self.lora_kernel_a, self.lora_kernel_b
        flat_a = ops.reshape(a, (-1, a.shape[-1]))
        flat_b = ops.reshape(b, (b.shape[0], -1))
        shape = tuple(a.shape[:-1]) + tuple(b.shape[1:])
        return ops.reshape(ops.matmul(flat_a, flat_b), shape) * self._lora_scale()

    @property
    def kernel(self):
        """`W`, or `W + (α/r)·A·B` in the compute dtype while the adapters exist (a quantised
        layer's own kernel is left as Keras gives it; its update is added to the output)."""
        kernel = super().kernel
        if not self.lora_adapters_enabled or self.quantization_mode is not None:
            return kernel
        merged = ops.cast(kernel, "float32") + self.lora_delta()
        return ops.cast(merged, self.compute_dtype)

    def quantized_call(self, inputs, training=None):
        outputs = super().quantized_call(inputs, training=training)
        if not self.lora_adapters_enabled:
            return outputs
        # `(x A) B`: the inputs' last axes (the kernel's input axes, in order) against `A`.
        a = ops.cast(self.lora_kernel_a, inputs.dtype)
        b = ops.cast(self.lora_kernel_b, inputs.dtype)
        update = ops.tensordot(ops.tensordot(inputs, a, axes=len(a.shape) - 1), b, axes=1)
        return outputs + ops.cast(update * self._lora_scale(), outputs.dtype)


def _flat_initializer(initializer, input_axes):
    """`initializer` drawn for the flattened `[Π input axes, r]` matrix (its fans), reshaped."""
    initializer = keras.initializers.get(initializer)

    def initialize(shape, dtype=None):
        rows = 1
        for size in shape[:input_axes]:
            rows *= size
        return ops.reshape(initializer((rows, shape[-1]), dtype=dtype), shape)

    return initialize
