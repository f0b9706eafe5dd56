"""A per-layer control that reads the state after chosen layers of a stack (e.g. early-exit
heads; survey §5.6)."""

from keras_xf.layers.blocks.layer_control import LayerControl


class LayerStateReader(LayerControl):
    """Reads `read(i, Z^{l_i + 1})` after each chosen layer `l_i` of a stack's run.

    Every row runs every layer (a plain run with the stack's options); after layer `l_i`
    (the `i`-th of `layers`, numbered `1 … L`) the control keeps `read(i, state)`, `state`
    the layer's output state `Z^{l_i + 1}` before the stack's final norm
    (`TransformerStack.output_state` applies it). The values come back in order in the
    carry's `"values"`.

    Args:
        layers: increasing layer numbers in `1 … L`.
        read: function `(i, state) -> value`.

    Example:
    >>> reader = LayerStateReader([2, 4], lambda i, state: stack.output_state(state))
    >>> states = stack.run_layers(x, reader)["control"]["values"]  # after layers 2 and 4
    """

    def __init__(self, layers, read):
        self.layers = list(layers)
        self.read = read

    def start(self, state):
        return {"values": ()}

    def after(self, index, state, carry, rows):
        if index + 1 not in self.layers:
            return carry
        value = self.read(len(carry["values"]), state)
        return {"values": carry["values"] + (value,)}
