"""A `keras.layers.Dense` whose LoRA adapters survive a `.keras` save (Hu et al. 2021)."""

import keras

from keras_xf.layers.lora.lora_saving import LoRASaving
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_width


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
    >>> dense(np.ones((2, 16), "float32")).shape  # B = 0: the output of W alone
    (2, 8)
    """

    def __init__(self, units, **kwargs):
        super().__init__(check_positive_int("units", units), **kwargs)

    def __call__(self, inputs, *args, **kwargs):
        # Checked here, before Keras' input spec, so the message names `inputs`.
        shape = tuple(inputs.shape)
        if len(shape) < 2:
            raise ValueError("inputs must have rank 2 or more, [..., input_dim]. Received: "
                             f"inputs.shape={shape}")
        if self.built and self.input_spec is not None and -1 in (self.input_spec.axes or {}):
            check_width(inputs, self.input_spec.axes[-1])  # the width `build` recorded
        return super().__call__(inputs, *args, **kwargs)

    def _adapters_on(self):
        return self.lora_enabled
