"""Encoder-only or decoder-only Transformer backbone (survey §2.1, §6)."""

import keras
from keras import ops

from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.models.backbones.arguments import block_template
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import check_reversible_arguments
from keras_xf.models.backbones.arguments import check_stack_options
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import takes_segment_ids
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.functional_model import layer_dtype
from keras_xf.models.backbones.block_factory import build_stack
from keras_xf.models.backbones.block_factory import prepare_block
from keras_xf.ops.checks import check_positive_int


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
        depth_initialization: optional dict, the stack's depth-aware initialisation of its
            projection kernels (survey §4.2.2; see `TransformerStack`), e.g.
            `deep_norm(decoder_layers=L)["decoder"].depth_initialization()`.
        num_segments: optional int, a learned segment (token-type) embedding `S` added to
            every token, `e_j += S[s_j]` (BERT's sentence pairs). With 2 or more segments the
            model takes a `segment_ids` input; with 1, every token is segment 0 and there is
            no such input (RoBERTa's single row).
        embedding_normalization: `None`, `"layer_norm"` or `"rms_norm"`, a norm of the
            summed embeddings (BERT's post-norm stack normalises its input there).
        embedding_epsilon: float, that norm's epsilon.
        position_offset: int, token `j` takes absolute position `j + position_offset`
            (learned or sinusoidal positions; RoBERTa starts at row 2). With learned
            positions the longest input is `max_sequence_length - position_offset`.
        stack_options: optional dict of further `TransformerStack` arguments (e.g.
            `{"fusion": "weighted_sum"}`, `{"layer_drop": 0.2}`, `{"share_layers": "all"}`,
            `{"multistep": "adams_bashforth_2"}`); `keras_xf.surgery.prune_layers` builds
            the model again with a subset of its layers.
        reversible: bool, a `ReversibleStack` in place of the `TransformerStack` (survey
            §5.4): the block template's mixer and feedforward on two streams of reversible
            layers, whose backward pass recomputes each layer's inputs from its outputs, so
            that the activation memory of training does not grow with `num_layers`. The
            template needs a feedforward, no cross-attention and `dropout=0`;
            `share_attention_maps`, `depth_initialization` and `stack_options` belong to
            `TransformerStack` and must keep their defaults.
        dtype: a dtype policy name or object.

    Inputs: `{"token_ids": int [B, T], "padding_mask": [B, T]}`, and `"segment_ids": int
    [B, T]` with `num_segments >= 2`.
    Outputs: `[B, T, d]` hidden states; called with `output_length=n`, those of the first
    `n` positions, `[B, n, d]`, the last layer computing only them (`TransformerStack`): a
    `[CLS]`-pooling task passes `n = 1` (`pooled_states`).

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
        depth_initialization=None,
        num_segments=None,
        embedding_normalization=None,
        embedding_epsilon=1e-5,
        position_offset=0,
        stack_options=None,
        reversible=False,
        dtype=None,
        **kwargs,
    ):
        check_model_arguments(locals())
        stack_options = check_stack_options(stack_options)
        if reversible:
            check_reversible_arguments(share_attention_maps, depth_initialization, stack_options)
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
            num_segments=num_segments,
            normalization=embedding_normalization,
            epsilon=embedding_epsilon,
            position_offset=position_offset,
            dtype=policy,
            name="embeddings",
        )
        self.transformer_stack = build_stack(
            template, num_layers, policy, "transformer_stack",
            depth_initialization=depth_initialization, stack_options=stack_options,
            reversible=reversible, share_attention_maps=share_attention_maps,
        )

        # Functional model
        inputs = token_inputs(segments=takes_segment_ids(num_segments))
        hidden = self._encode(inputs, causal)
        super().__init__(
            inputs=inputs,
            outputs=hidden,
            dtype=dtype,
            **kwargs,
        )

        # Config
        record_config(self, locals())

    def _encode(self, inputs, causal, output_length=None):
        """The embeddings and the stack, on the model's inputs (symbolic or not)."""
        hidden = self.embeddings(inputs["token_ids"], segment_ids=inputs.get("segment_ids"))
        return self.transformer_stack(
            hidden, padding_mask=ops.cast(inputs["padding_mask"], "bool"),
            use_causal_mask=causal, output_length=output_length,
        )

    def call(self, inputs, training=None, mask=None, output_length=None):
        # The functional graph computes every position; the first ones alone run the layers
        # directly, with the same weights.
        if output_length is None:
            return super().call(inputs, training=training, mask=mask)
        return self._encode(inputs, self.causal, output_length)

    def compute_output_spec(self, inputs, training=None, mask=None, output_length=None):
        spec = super().compute_output_spec(inputs, training=training, mask=mask)
        if output_length is None:
            return spec
        check_positive_int("output_length", output_length)
        return keras.KerasTensor((spec.shape[0], output_length, spec.shape[2]), dtype=spec.dtype)

    def token_vocabulary_sizes(self):
        """`FunctionalModel.token_vocabulary_sizes`: `token_ids` index the vocabulary."""
        return {"token_ids": self.embeddings.vocabulary_size}

    @property
    def uses_segment_ids(self):
        """Whether the model takes a `segment_ids` input (`num_segments >= 2`)."""
        return takes_segment_ids(self.num_segments)

    @property
    def token_embedding(self):
        return self.embeddings.token_embedding


def pooled_states(backbone, pooling, inputs):
    """`Pool(Encoder(x))` of a task whose output depends on the pooled state alone: with
    `[CLS]` (first-token) pooling the backbone's last layer computes that position only
    (`output_length=1`: its keys and values still span all positions, so the state is the
    same), otherwise the pooling reduces all states over the padding mask."""
    if pooling.mode == "cls":
        return pooling(backbone(inputs, output_length=1))
    return pooling(backbone(inputs), padding_mask=ops.cast(inputs["padding_mask"], "bool"))
