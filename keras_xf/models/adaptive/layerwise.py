"""What a task needs to run an encoder backbone layer by layer itself (early exit, layer
skipping; survey §5.6): the embeddings, blocks and pooled state of the backbone, whose layers
`arguments.check_layerwise_backbone` has checked to be functions of their blocks alone."""


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
