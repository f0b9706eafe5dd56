"""A `keras.layers.Dense` whose LoRA adapters survive a `.keras` save (Hu et al. 2021)."""

import keras

from keras_xf.layers.lora.lora_saving import LoRASaving


@keras.saving.register_keras_serializable(package="keras_xf")
class LoRADense(LoRASaving, keras.layers.Dense):
    """`y = x W + b`, and after `enable_lora(r, lora_alpha=α)`: `y = x (W + (α/r)·A·B) + b`
    with `A [d_in, r]` random (He uniform), `B [r, d_out]` zero and `W` frozen.

    Keras' `Dense` in every respect (arguments, call, quantisation, `enable_lora`), except
    that a LoRA-enabled layer saves `W`, `A` and `B` separately instead of the merged kernel
    (`LoRASaving`), so a reloaded model keeps trainable adapters. The projections of
    keras_xf's feedforwards are `LoRADense` layers.

    Args:
        units: int, output width.
        **kwargs: `keras.layers.Dense` arguments.

    Example:
    >>> dense = LoRADense(8)
    >>> dense.build((None, 16))
    >>> dense.enable_lora(2)
    >>> [v.name for v in dense.trainable_variables]  # ['bias', 'lora_kernel_a', 'lora_kernel_b']
    """

    def _adapters_on(self):
        return self.lora_enabled
