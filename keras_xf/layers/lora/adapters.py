"""LoRA adapters of keras_xf's own layers, and which projections carry adapters (Hu et al.
2021)."""

import keras

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number


class LoRAAdapters:
    """The adapters `A`, `B` of a layer that computes with `W + (α/r)·A·B`, for the layers
    whose `enable_lora` is keras_xf's own (`LoRAEinsumDense`, `ExpertWeights`,
    `TokenEmbedding`'s output head): the checks of Keras' `Dense.enable_lora` protocol and
    the steps it takes, shared.

    A layer's `enable_lora(rank, lora_alpha=None, ...)` calls `_check_lora_settings`, makes
    its own checks and computes the adapters' shapes, then calls `_add_lora_adapters`, which
    adds `lora_kernel_a`, `lora_kernel_b` (float32, as Keras' `Dense` keeps them, also over a
    quantised kernel), freezes the base kernel and sets `lora_adapters_enabled`, `lora_rank`
    and `lora_alpha` (`rank` when `None`). `LoRASaving` reads `_adapters_on()`.
    """

    lora_adapters_enabled = False
    lora_rank = None
    lora_alpha = None

    def _check_lora_settings(self, rank, lora_alpha):
        """`(rank, alpha)`, `alpha` being `rank` when `lora_alpha` is `None`; a `ValueError`
        naming `rank` or `lora_alpha` for a value that is not positive, or naming the layer
        when it is not built or its adapters exist already."""
        rank = check_positive_int("rank", rank)
        if lora_alpha is not None:
            check_positive_number("lora_alpha", lora_alpha)
        if not self.built:
            raise ValueError(f"Cannot enable LoRA on '{self.name}' before it is built "
                             "(call or build it first). Received: built=False")
        if self.lora_adapters_enabled:
            raise ValueError(f"LoRA is already enabled on '{self.name}'; it can be enabled "
                             f"once. Received: rank={rank}")
        return rank, rank if lora_alpha is None else lora_alpha

    def _add_lora_adapters(self, rank, lora_alpha, a_shape, b_shape, a_initializer,
                           b_initializer, frozen):
        """Adds `lora_kernel_a` of `a_shape` and `lora_kernel_b` of `b_shape` (float32, from
        the given initializers), makes the base kernel `frozen` untrainable and records
        `rank` and `lora_alpha`, both as `_check_lora_settings` returned them."""
        self._tracker.unlock()
        self.lora_kernel_a = self.add_weight(
            name="lora_kernel_a", shape=tuple(a_shape),
            initializer=keras.initializers.get(a_initializer), dtype="float32")
        self.lora_kernel_b = self.add_weight(
            name="lora_kernel_b", shape=tuple(b_shape),
            initializer=keras.initializers.get(b_initializer), dtype="float32")
        self._tracker.lock()
        frozen.trainable = False
        self.lora_adapters_enabled = True
        self.lora_rank = rank
        self.lora_alpha = lora_alpha

    def _adapters_on(self):
        return self.lora_adapters_enabled

    def _lora_scale(self):
        """`α / r`."""
        return self.lora_alpha / self.lora_rank


def has_lora(layer):
    """Whether `layer` computes with `W + (α/r)·A·B`: keras_xf's own adapters
    (`lora_adapters_enabled` of a `LoRAAdapters` layer, with Keras' `lora_enabled` left off
    on a `LoRAEinsumDense`), or Keras' `lora_enabled` on a `Dense` or `EinsumDense`. Any
    other layer: `False`."""
    if isinstance(layer, LoRAAdapters):
        return layer.lora_adapters_enabled
    if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        return layer.lora_enabled
    return False
