"""Saving the variables of a layer that `model.quantize` changes (survey §5.9)."""


class QuantizedVariableSaving:
    """Saves and loads a layer's variables by name, in the order its
    `variable_serialization_spec` gives for its quantisation mode (`None`, `"int8"`,
    `"int4"`), as Keras' `Dense` and `Embedding` do; a mode without an entry raises the
    layer's `_quantization_mode_error`. Mixed into a `keras.layers.Layer`."""

    def _serialised_names(self):
        spec = self.variable_serialization_spec
        if self.quantization_mode not in spec:
            raise self._quantization_mode_error(self.quantization_mode)
        return spec[self.quantization_mode]

    def save_own_variables(self, store):
        if not self.built:
            return
        for index, name in enumerate(self._serialised_names()):
            store[str(index)] = getattr(self, name)

    def load_own_variables(self, store):
        self._check_load_own_variables(store)
        if not self.built:
            return
        for index, name in enumerate(self._serialised_names()):
            getattr(self, name).assign(store[str(index)])
