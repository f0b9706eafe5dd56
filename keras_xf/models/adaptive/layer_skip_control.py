"""The per-layer control of learned layer skipping: a gate before each layer decides, per
sequence, whether the layer runs (survey §5.6)."""

from keras_xf.layers.blocks.layer_control import LayerControl


class LayerSkipControl(LayerControl):
    """Runs or skips each layer of a stack per sequence by the layer's `LayerSkipGate`.

    Two forms of the same decision `g_l = 1[p_l ≥ τ]`, `p_l = σ(w_l · mean_j s_j + b_l)`:

    - mixing (`skip_computation=False`, training and the functional model): every layer
      runs, and its gate mixes the block's output into the state,
      `gate(Z, Block(Z)) = Z + g·(Block(Z) − Z)` (straight-through or soft in training, the
      gate's compute penalty added to the model's losses);
    - skipping (`skip_computation=True`, inference): the gate decides first
      (`LayerSkipGate.decision`); a sequence that skips the layer passes it as the
      identity, and the stack does not compute a layer that no sequence runs. The carry's
      `"executed"` holds each layer's decisions, bool `[B]` per layer.

    Either way the stack combines the layer's output with its options (layer drop, fusion,
    multi-step residuals…), so at inference the two forms give the same states.

    Args:
        gates: one `LayerSkipGate` per layer.
        padding_mask: bool `[B, T]`, the real tokens.
        threshold: optional float `τ` in place of the gates' own (skipping form).
        skip_computation: bool, the skipping form.

    Example:
    >>> control = LayerSkipControl(model.gates, mask, skip_computation=True)
    >>> result = model.backbone.transformer_stack.run_layers(hidden, control,
    ...                                                      padding_mask=mask)
    >>> executed = result["control"]["executed"]
    """

    def __init__(self, gates, padding_mask, threshold=None, skip_computation=False):
        self.gates = list(gates)
        self.padding_mask = padding_mask
        self.threshold = threshold
        self.skip_computation = skip_computation

    def start(self, state):
        return {"executed": ()} if self.skip_computation else {}

    def rows(self, index, state, carry):
        if not self.skip_computation:
            return None
        return self.gates[index].decision(state, self.padding_mask, threshold=self.threshold)

    def update(self, index, inputs, outputs, carry):
        if self.skip_computation:
            return outputs
        return self.gates[index](inputs, outputs, padding_mask=self.padding_mask)

    def after(self, index, state, carry, rows):
        if not self.skip_computation:
            return carry
        return {"executed": carry["executed"] + (rows,)}

    def skipped(self, index, state, carry, rows):
        return self.after(index, state, carry, rows)
