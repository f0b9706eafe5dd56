"""Saving a LoRA-enabled `Dense` / `EinsumDense` with its adapters (Hu et al. 2021)."""


class LoRASaving:
    """Saves and loads a LoRA-enabled projection as it is: the frozen base kernel `W`
    (not `W + (α/r)·A·B`), its bias and quantisation variables in Keras' order, then the
    adapters `A` and `B`. A `.keras` file thus gives back the same adapters, still trainable.

    Keras' own `Dense` and `EinsumDense` save the merged kernel and, on loading, set `A` and
    `B` to zero, which leaves adapters that can no longer learn (the gradient of `A` is
    `∝ B = 0` and that of `B` is `∝ A = 0`). A layer without LoRA saves as Keras' does.
    Mixed into a subclass of `keras.layers.Dense` or `keras.layers.EinsumDense` that says
    through `_adapters_on()` whether its adapters `lora_kernel_a`, `lora_kernel_b` exist.
    """

    def _lora_variables(self):
        """The variables saved, in order, for the layer's quantisation mode."""
        spec = self.variable_serialization_spec
        if self.quantization_mode not in spec:
            raise self._quantization_mode_error(self.quantization_mode)
        variables = []
        for name in spec[self.quantization_mode]:
            if name == "kernel":
                variables.append(self._kernel)
            elif name == "bias" and self.bias is None:
                continue
            elif name in ("kernel_zero", "g_idx") and not hasattr(self, name):
                continue  # sub-channel int4 variables only
            else:
                variables.append(getattr(self, name))
        return variables + [self.lora_kernel_a, self.lora_kernel_b]

    def save_own_variables(self, store):
        if not (self.built and self._adapters_on()):
            return super().save_own_variables(store)
        for index, variable in enumerate(self._lora_variables()):
            store[str(index)] = variable

    def load_own_variables(self, store):
        if not (self.built and self._adapters_on()):
            return super().load_own_variables(store)
        variables = self._lora_variables()
        if len(store.keys()) != len(variables):
            raise ValueError(
                f"Layer '{self.name}' has LoRA enabled and expects {len(variables)} saved "
                f"variables (base weights, then the adapters A and B). Received: "
                f"{len(store.keys())} variables (a file saved without LoRA: load it into a "
                "model without LoRA, then call enable_lora)."
            )
        for index, variable in enumerate(variables):
            variable.assign(store[str(index)])

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless `type_check=False`: this class adds no variable
        # that quantisation would have to know about besides the adapters, which stay float.
        return super().quantize(mode, type_check=False, config=config)
