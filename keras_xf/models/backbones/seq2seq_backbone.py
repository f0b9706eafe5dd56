"""Encoder-decoder Transformer backbone (survey §2.1, §2.6)."""

import keras
from keras import ops

from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.models.backbones.arguments import block_template
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import check_stack_options
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.functional_model import layer_dtype
from keras_xf.models.backbones.block_factory import build_stack
from keras_xf.models.backbones.block_factory import prepare_block
from keras_xf.models.backbones.block_factory import side_depth_initialization
from keras_xf.ops.checks import check_padding_mask


@keras.saving.register_keras_serializable(package="keras_xf")
class Seq2SeqBackbone(FunctionalModel):
    """Source and target token ids to encoder and decoder states.

    `H_enc = Encoder(Embed_src(x))`, `S = Decoder(Embed_tgt(y), H_enc)`, where each decoder
    layer applies causal self-attention, cross-attention to `H_enc` and a feedforward
    (survey §2.1, §2.6). The encoder layers are clones of `block` (or of a default block);
    the decoder layers are clones of `decoder_block`, by default `block` with a
    cross-attention copy of its attention mixer.

    Args:
        vocabulary_size: int, target vocabulary (and source one when shared).
        num_layers: int, layers of encoder and decoder (see `num_decoder_layers`).
        hidden_dim: int, `d`.
        num_heads, intermediate_dim: ints for the default blocks.
        max_sequence_length: int.
        block: optional encoder block template.
        decoder_block: optional decoder block template (with `cross_attention`).
        source_vocabulary_size: int; `None` = `vocabulary_size`.
        share_embeddings: bool, one embedding matrix for source and target (survey §5.4;
            needs equal vocabularies).
        num_decoder_layers: int; `None` = `num_layers`.
        share_score_biases: bool, each stack's layers use its first layer's score biases
            (one relative-position bias per stack, as in T5; see `TransformerStack`).
        depth_initialization: optional dict, the depth-aware initialisation of both
            stacks' projection kernels (survey §4.2.2; see `TransformerStack`), or one per
            side, `{"encoder": {...}, "decoder": {...}}` (e.g. DeepNorm's constants of an
            encoder-decoder, `deep_norm(N, M)[side].depth_initialization()`); a side
            missing from it keeps its layers' own initializers.
        stack_options: optional dict of further `TransformerStack` arguments given to the
            encoder and the decoder stacks alike (fusion, layer drop, parameter sharing,
            multi-step residuals; see `TransformerBackbone`). The decoder's options act on
            each position alone, so cached decoding works with them.
        position, num_key_value_heads, activation, norm_placement, normalization, dropout,
        tie_embeddings, embedding_scale, dtype: as in `TransformerBackbone`.

    Inputs: `encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids`,
    `decoder_padding_mask`, each `[B, length]`.
    Outputs: `{"encoder_sequence_output": [B, S, d], "decoder_sequence_output": [B, T, d]}`.
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
        decoder_block=None,
        source_vocabulary_size=None,
        share_embeddings=True,
        num_decoder_layers=None,
        position="sinusoidal",
        num_key_value_heads=None,
        activation="relu",
        norm_placement="post",
        normalization="layer_norm",
        dropout=0.0,
        tie_embeddings=True,
        embedding_scale=False,
        share_score_biases=False,
        depth_initialization=None,
        stack_options=None,
        dtype=None,
        **kwargs,
    ):
        check_model_arguments(locals())
        stack_options = check_stack_options(stack_options, ("share_score_biases",))
        source_vocabulary = source_vocabulary_size or vocabulary_size
        if share_embeddings and source_vocabulary != vocabulary_size:
            raise ValueError(
                "share_embeddings needs one vocabulary. Received: vocabulary_size="
                f"{vocabulary_size}, source_vocabulary_size={source_vocabulary_size}"
            )
        block = block_template(block, locals())
        encoder_template = prepare_block(block, position)
        decoder_template = prepare_block(
            block if decoder_block is None else decoder_block, position, cross_attention=True
        )
        policy = layer_dtype(dtype)
        embedding_args = dict(
            position=position,
            max_sequence_length=max_sequence_length,
            scale=embedding_scale,
            dropout=dropout,
            dtype=policy,
        )

        # Layers
        self.decoder_embeddings = TokenAndPositionEmbedding(
            vocabulary_size, hidden_dim, tie_weights=tie_embeddings,
            name="decoder_embeddings", **embedding_args
        )
        if share_embeddings:
            self.encoder_embeddings = self.decoder_embeddings
        else:
            self.encoder_embeddings = TokenAndPositionEmbedding(
                source_vocabulary, hidden_dim, name="encoder_embeddings", **embedding_args
            )
        self.encoder, self.decoder = (
            build_stack(template, layers, policy, side, stack_options=stack_options,
                        depth_initialization=side_depth_initialization(depth_initialization,
                                                                       side),
                        share_score_biases=share_score_biases)
            for template, layers, side in (
                (encoder_template, num_layers, "encoder"),
                (decoder_template, num_decoder_layers or num_layers, "decoder"))
        )

        # Functional model
        inputs = {**token_inputs("encoder_"), **token_inputs("decoder_")}
        encoder_mask = ops.cast(inputs["encoder_padding_mask"], "bool")
        encoded = self.encoder(
            self.encoder_embeddings(inputs["encoder_token_ids"]), padding_mask=encoder_mask
        )
        decoded = self.decoder(
            self.decoder_embeddings(inputs["decoder_token_ids"]),
            padding_mask=ops.cast(inputs["decoder_padding_mask"], "bool"),
            encoder_outputs=encoded,
            encoder_padding_mask=encoder_mask,
            use_causal_mask=True,
        )
        super().__init__(
            inputs=inputs,
            outputs={"encoder_sequence_output": encoded, "decoder_sequence_output": decoded},
            dtype=dtype,
            **kwargs,
        )

        # Config
        record_config(self, locals())

    def token_vocabulary_sizes(self):
        """`FunctionalModel.token_vocabulary_sizes`: both token inputs index vocabularies."""
        return {"encoder_token_ids": self.encoder_embeddings.vocabulary_size,
                "decoder_token_ids": self.decoder_embeddings.vocabulary_size}

    def encode(self, encoder_token_ids, encoder_padding_mask, training=None):
        """Runs the encoder alone: `[B, S]` ids to `[B, S, d]` states."""
        check_padding_mask(encoder_padding_mask, encoder_token_ids, "encoder_padding_mask",
                           "encoder_token_ids")
        mask = ops.cast(encoder_padding_mask, "bool")
        embedded = self.encoder_embeddings(encoder_token_ids, training=training)
        return self.encoder(embedded, padding_mask=mask, training=training)
