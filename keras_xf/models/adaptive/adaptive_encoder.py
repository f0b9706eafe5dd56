"""The base of the encoder tasks whose backbone's layers run under per-layer control (early
exit, layer skipping; survey §5.6)."""

from keras import ops

from keras_xf.models.backbones.functional_model import FunctionalModel


class AdaptiveEncoder(FunctionalModel):
    """An encoder task whose backbone's `TransformerStack` runs layer by layer under a
    `LayerControl` (`TransformerStack.run_layers`), with every option of the stack.

    A subclass has a `backbone` (a non-causal `TransformerBackbone`, checked by
    `arguments.check_adaptive_backbone`) and a `pooling` layer, and declares what it adds:
    - `exit_layers`: the layers carrying an early exit (`EarlyExitClassifier`); `None` for
      a model without exits;
    - `gates`: one `LayerSkipGate` per layer (`LayerSkippingClassifier`); `None` for a model
      without them.
    """

    exit_layers = None
    gates = None

    @property
    def blocks(self):
        """The encoder's layers, in order."""
        return self.backbone.transformer_stack.blocks

    def embed(self, inputs):
        """`s^0`: the backbone's embeddings of `inputs`."""
        return self.backbone.embeddings(inputs["token_ids"],
                                        segment_ids=inputs.get("segment_ids"))

    def pooled_state(self, hidden, mask):
        """`Pool(Norm(s^l))`: the pooled state after a layer, normalised by the stack's final
        norm when it has one (as the last layer's is), `[B, d]`."""
        state = self.backbone.transformer_stack.output_state(hidden)
        return self.pooling(state, padding_mask=mask)

    def run_layers(self, inputs, control):
        """The embeddings of `inputs` through the backbone's layers under `control`: the
        result of `TransformerStack.run_layers` (`"outputs"`, the final norm applied, and
        `"control"`)."""
        mask = ops.cast(inputs["padding_mask"], "bool")
        return self.backbone.transformer_stack.run_layers(
            self.embed(inputs), control, padding_mask=mask, use_causal_mask=False)
