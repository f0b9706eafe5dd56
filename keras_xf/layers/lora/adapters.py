"""Which projections carry LoRA adapters (Hu et al. 2021)."""

import keras

from keras_xf.layers.lora.lora_einsum_dense import LoRAEinsumDense


def has_lora(layer):
    """Whether `layer`, a `Dense` or `EinsumDense`, computes with `W + (α/r)·A·B`: Keras'
    `lora_enabled`, or a `LoRAEinsumDense`'s own adapters (`lora_adapters_enabled`, with
    Keras' flag left off). Any other layer: `False`."""
    if isinstance(layer, LoRAEinsumDense):
        return layer.lora_adapters_enabled
    if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        return layer.lora_enabled
    return False
