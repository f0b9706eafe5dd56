"""Encoder-only or decoder-only Transformer backbone (survey §2.1, §6)."""

import keras
from keras import ops

from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.models.arguments import block_template
from keras_xf.models.arguments import check_model_arguments
from keras_xf.models.arguments import record_config
from keras_xf.models.arguments import token_inputs
from keras_xf.models.backbone import FunctionalModel
from keras_xf.models.backbone import layer_dtype
from keras_xf.models.block_factory import prepare_block


@keras.saving.register_keras_serializable(package="keras_xf")
class TransformerBackbone(FunctionalModel):
    """Token ids to contextual states: `H^L = Stack(Embed(x) + PE)`.

    With `causal=True` every layer uses the causal mask (a decoder-only language model,
    survey §6); otherwise it is an encoder (BERT-like). The layers come from one block
    template (`block=`), so any mixer, feedforward or norm placement composes into the model;
    without a template a `MultiHeadAttention` + `FeedForward` block is built from
    `num_heads`, `intermediate_dim`, `activation` and `norm_placement`.

    Args:
        vocabulary_size: int.
        num_layers: int, `L`.
        hidden_dim: int, `d`.
        num_heads: int (needed without `block`).
        intermediate_dim: int, `d_ffn` (needed without `block`).
        max_sequence_length: int, longest sequence (rows of a learned position table).
        block: optional `TransformerBlock` template, or a list of templates used in turn
            (a hybrid stack: layer `l` copies `block[l % len(block)]`).
        position: `"sinusoidal"`, `"learned"`, `"rotary"` (RoPE inside attention) or `"none"`.
        causal: bool, decoder-only when True.
        num_key_value_heads: int for MQA / GQA in the default block.
        activation: feedforward activation of the default block.
        norm_placement: `"post"` or `"pre"` for the default block.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"` for the default
            block.
        dropout: float, dropout of embeddings and default block.
        tie_embeddings: bool, the token embedding also serves as output projection.
        embedding_scale: bool, scale token embeddings by `√d`.
        share_attention_maps: int `k`, consecutive layers sharing one attention map (survey
            §5.4; see `TransformerStack`); 1 = no sharing.
        dtype: a dtype policy name or object.

    Inputs: `{"token_ids": int [B, T], "padding_mask": [B, T]}`.
    Outputs: `[B, T, d]` hidden states.

    Example:
    >>> backbone = TransformerBackbone(1000, num_layers=2, hidden_dim=32, num_heads=4,
    ...                                intermediate_dim=64, causal=True)
    >>> h = backbone({"token_ids": np.ones((2, 8), "int32"), "padding_mask": np.ones((2, 8))})
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        hidden_dim,
        num_heads=None,
        intermediate_dim=None,
        max_sequence_length=512,
        block=None,
        position="sinusoidal",
        causal=False,
        num_key_value_heads=None,
        activation="relu",
        norm_placement="post",
        normalization="layer_norm",
        dropout=0.0,
        tie_embeddings=True,
        embedding_scale=False,
        share_attention_maps=1,
        dtype=None,
        **kwargs,
    ):
        check_model_arguments(locals())
        block = block_template(block, locals())
        template = prepare_block(block, position)
        policy = layer_dtype(dtype)

        # Layers
        self.embeddings = TokenAndPositionEmbedding(
            vocabulary_size,
            hidden_dim,
            position=position,
            max_sequence_length=max_sequence_length,
            tie_weights=tie_embeddings,
            scale=embedding_scale,
            dropout=dropout,
            dtype=policy,
            name="embeddings",
        )
        self.transformer_stack = TransformerStack(
            template,
            num_layers,
            share_attention_maps=share_attention_maps,
            dtype=policy,
            name="transformer_stack",
        )

        # Functional model
        inputs = token_inputs()
        hidden = self.embeddings(inputs["token_ids"])
        hidden = self.transformer_stack(
            hidden, padding_mask=ops.cast(inputs["padding_mask"], "bool"), use_causal_mask=causal
        )
        super().__init__(
            inputs=inputs,
            outputs=hidden,
            dtype=dtype,
            **kwargs,
        )

        # Config
        record_config(self, locals())

    @property
    def token_embedding(self):
        return self.embeddings.token_embedding
