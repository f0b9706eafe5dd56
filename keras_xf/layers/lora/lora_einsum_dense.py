"""A `keras.layers.EinsumDense` whose LoRA adapters survive a `.keras` save (Hu et al. 2021)."""

import keras

from keras_xf.layers.lora.lora_saving import LoRASaving


@keras.saving.register_keras_serializable(package="keras_xf")
class LoRAEinsumDense(LoRASaving, keras.layers.EinsumDense):
    """`y = einsum(equation, x, W) + b`, and after `enable_lora(r, lora_alpha=α)`:
    `W + (α/r)·A·B` in place of `W`, with `A [*W.shape[:-1], r]` random, `B [r, W.shape[-1]]`
    zero and `W` frozen (Keras' `EinsumDense.enable_lora`).

    For the attention projections into heads, `W [d, H, Dh]`, that is one rank-`r` update per
    head (`A [d, H, r]`, `B [r, Dh]` shared by the heads), keras-hub's convention; out of
    heads, `W [H, Dh, d]`, it is the plain low-rank update of the `[H·Dh, d]` matrix.
    Keras' `EinsumDense` in every respect except saving: a LoRA-enabled layer saves `W`, `A`
    and `B` separately instead of the merged kernel (`LoRASaving`).

    Args:
        equation: str, the einsum equation.
        output_shape: the output shape without the batch axis.
        **kwargs: `keras.layers.EinsumDense` arguments.

    Example:
    >>> dense = LoRAEinsumDense("btd,dhk->bthk", output_shape=(None, 2, 4))
    >>> dense.build((None, None, 8))
    >>> dense.enable_lora(2)
    >>> tuple(dense.lora_kernel_a.shape)  # (8, 2, 2)
    """
