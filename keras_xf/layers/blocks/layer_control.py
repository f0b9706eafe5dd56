"""The per-layer hook of a stack's runner: which rows run a layer, which have stopped, and
what is read after each layer (early exit, layer skipping; survey §5.6)."""


class LayerControl:
    """Steers `TransformerStack.run_layers` layer by layer; the stack keeps its options.

    The stack runs layer `l = 1 … L` (`index = l − 1`) on its input `Z^l` (`Z^1` the stack's
    input, `Z^{L+1}` its output before the final norm) with every option it has (shared
    layers, fusion, layer drop, multi-step residuals, shared attention maps, hybrid
    templates). Before each layer it asks the control which rows run it (`rows`) and which
    have stopped (`stopped`):

    - a row that does not run layer `l` passes it as the identity: the block's output is its
      input, `Block^l(Z^l) = Z^l` (the increment `f^l = 0`), and the stack's options combine
      it as any output;
    - a row that has stopped keeps its state: `Z^{l+1} = Z^l`, and every later layer caches
      the keys and values of that frozen state (the exit state copied upward);
    - when no row runs layer `l` (all skipped or stopped), the layer runs inside
      `keras.ops.cond`'s other branch: its block is not called; only its mixer sub-layer
      runs where it must leave something behind (a cache to fill, attention weights that
      later layers share).

    After the layer the control reads the new state `Z^{l+1}` (`after`, or `skipped` when no
    row ran it). `TransformerStack.output_state(Z)` gives what the stack would return had it
    ended there (its final norm applied).

    The control's own state (`carry`) is a dict of tensors, the same structure before and
    after every layer that may be skipped (the branches of `keras.ops.cond` must agree).
    This base class is the plain run: every row runs every layer, nothing is read.

    Example:
    >>> class LastRows(LayerControl):
    ...     def start(self, state):
    ...         return {"norms": ()}
    ...     def after(self, index, state, carry, rows):
    ...         return {"norms": carry["norms"] + (keras.ops.norm(state[:, -1], axis=-1),)}
    >>> result = stack.run_layers(x, LastRows())
    >>> result["control"]["norms"]  # one [B] tensor per layer
    """

    def start(self, state):
        """The control's carry before the first layer, from the stack's input `Z^1`."""
        return {}

    def rows(self, index, state, carry):
        """Bool `[B]`: the rows that run layer `index` on `state` (its input); `None`: all."""
        return None

    def stopped(self, carry):
        """Bool `[B]`: the rows that have stopped (their state is frozen); `None`: none."""
        return None

    def update(self, index, inputs, outputs, carry):
        """The output of layer `index`'s block as the stack combines it, from its inputs
        `Z^l` and its outputs `Block^l(Z^l)` (e.g. a gate mixing the two); `outputs` by
        default."""
        return outputs

    def after(self, index, state, carry, rows):
        """The carry after layer `index` ran for some rows (`rows`: as `self.rows` gave
        them); `state` is the layer's output state `Z^{l+1}`."""
        return carry

    def skipped(self, index, state, carry, rows):
        """The carry after layer `index` ran for no row; `carry` by default."""
        return carry
