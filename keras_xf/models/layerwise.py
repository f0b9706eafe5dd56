"""What a task needs to run an encoder backbone layer by layer itself (early exit, layer
skipping; survey §5.6): the check that each layer is a function of its block alone, and the
embeddings, blocks and pooled state of the backbone."""

from keras_xf.layers.blocks.transformer_stack import TransformerStack


def check_layerwise_backbone(backbone):
    """A non-causal `TransformerBackbone` whose stack is a plain `TransformerStack`: fusion,
    layer drop, multi-step residuals and shared attention maps make a layer's output depend
    on more than its block, so a task that calls the blocks one by one refuses them."""
    stack = backbone.transformer_stack
    plain = (isinstance(stack, TransformerStack) and not stack._combines_layers
             and stack.share_attention_maps == 1)
    if backbone.causal or not plain:
        raise ValueError(
            "backbone must be a non-causal TransformerBackbone whose stack has no layer "
            "fusion, layer drop, multi-step residuals, shared attention maps or reversible "
            f"layers. Received: causal={backbone.causal}, stack={type(stack).__name__}"
        )


class LayerwiseEncoder:
    """Methods of a task with a `backbone` (checked by `check_layerwise_backbone`) and a
    `pooling` layer, that calls the backbone's layers itself."""

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
        norm = self.backbone.transformer_stack.output_norm
        if norm is not None:
            hidden = norm(hidden)
        return self.pooling(hidden, padding_mask=mask)
