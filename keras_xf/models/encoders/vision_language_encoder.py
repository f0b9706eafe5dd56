"""Single-stream vision-language encoder over text tokens and image patches (survey §6.5, ViLT)."""

import keras
from keras import ops

from keras_xf.layers.attention.perceiver_resampler import PerceiverResampler
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.patch_embedding import PatchEmbedding
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.backbones.arguments import block_template
from keras_xf.models.backbones.arguments import check_image_shape
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import classifier_compile_defaults
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.functional_model import layer_dtype
from keras_xf.models.backbones.block_factory import prepare_block

TEXT, IMAGE = 0, 1


def _resampler(resampler, policy):
    if resampler is None:
        return None
    resampler = clone_layer(resampler)  # a fresh, unbuilt copy with the model's policy
    if not isinstance(resampler, PerceiverResampler):
        raise ValueError(
            "resampler must be a PerceiverResampler. Received: "
            f"resampler={type(resampler).__name__}"
        )
    if policy is not None:
        resampler = clone_layer(resampler, dtype=keras.dtype_policies.serialize(policy))
    return resampler


@keras.saving.register_keras_serializable(package="keras_xf")
class VisionLanguageEncoder(FunctionalModel):
    """One Transformer encoder over `[text tokens; image patches]` (survey §6.5, ViLT-style).

    Survey §6.5: text and image are each turned into a sequence of `d`-dimensional embeddings,
    the two sequences are concatenated, and a Transformer encoder produces representations of
    both; a classifier on top predicts e.g. an answer class. Here

        `t_j = TokEmb(x_j) + P_text[j] + E_type[0]`         (text, `j < T`)
        `v_n = PatchEmb(I)_n + P_image[n] + E_type[1]`      (patches, `n < N = HW/P²`, §6.4)
        `H = Stack([t_1 … t_T; v_1 … v_N])`,   `h = Pool(H)`

    with learned position tables for each modality and a learned modality (type) embedding.
    The text padding mask is extended by `N` always-real image positions, so padded text
    tokens are never attended to and never pooled; image patches are never padded. With a
    `resampler` (`PerceiverResampler`, survey §5.7) the `N` patch embeddings (with their
    positions) are first compressed to `r` latent vectors, which replace them.

    Args:
        vocabulary_size: int.
        image_shape: `(height, width, channels)`, height and width divisible by `patch_size`.
        patch_size: int `P`.
        num_layers: int, encoder layers.
        hidden_dim: int `d`.
        num_heads: int (needed without `block`).
        intermediate_dim: int (needed without `block`).
        max_sequence_length: int, longest text (rows of the text position table).
        num_classes: optional int; when set the model outputs float32 class logits.
        pooling: `"mean"` (default, over real text tokens and all image tokens), `"cls"`
            (the first text token, e.g. a `[CLS]` id) or `"max"`.
        block: optional `TransformerBlock` template (any mixer / feedforward); without it a
            pre-norm `MultiHeadAttention` + `FeedForward` block is built (as ViT and ViLT).
        resampler: optional `PerceiverResampler` (or its config) compressing the patches;
            the model builds a fresh copy of it (its own weights, the model's dtype policy).
        num_key_value_heads, activation, norm_placement, normalization: of the default block.
        dropout: float, embedding and default-block dropout.
        head_intermediate_dim, head_dropout: of the classification head.
        name, dtype, trainable: base model arguments.

    Inputs: `{"token_ids": int [B, T], "padding_mask": [B, T], "images": [B, H, W, C]}`.
    Outputs: `{"sequence_output": [B, T + N, d], "pooled_output": [B, d]}` (text positions
    first), or float32 logits `[B, num_classes]` when `num_classes` is set
    (`feature_extractor()` then gives the model with the two feature outputs).

    Example:
    >>> model = VisionLanguageEncoder(vocabulary_size=100, image_shape=(8, 8, 1), patch_size=4,
    ...                               num_layers=2, hidden_dim=16, num_heads=2,
    ...                               intermediate_dim=32, max_sequence_length=12, num_classes=3)
    >>> logits = model({"token_ids": np.ones((2, 5), "int32"),
    ...                 "padding_mask": np.ones((2, 5), "int32"),
    ...                 "images": np.zeros((2, 8, 8, 1), "float32")})  # (2, 3)
    """

    def __init__(
        self,
        vocabulary_size,
        image_shape,
        patch_size,
        num_layers,
        hidden_dim,
        num_heads=None,
        intermediate_dim=None,
        max_sequence_length=512,
        num_classes=None,
        pooling="mean",
        block=None,
        resampler=None,
        num_key_value_heads=None,
        activation="gelu",
        norm_placement="pre",
        normalization="layer_norm",
        dropout=0.0,
        head_intermediate_dim=None,
        head_dropout=0.0,
        name=None,
        dtype=None,
        trainable=True,
    ):
        check_model_arguments(locals())
        image_shape = check_image_shape(image_shape, patch_size)
        num_patches = (image_shape[0] // patch_size) * (image_shape[1] // patch_size)
        block = block_template(block, locals())
        template = prepare_block(block, "learned")
        policy = layer_dtype(dtype)

        # Layers
        self.text_embedding = TokenAndPositionEmbedding(
            vocabulary_size,
            hidden_dim,
            position="learned",
            max_sequence_length=max_sequence_length,
            dropout=dropout,
            dtype=policy,
            name="text_embedding",
        )
        self.patch_embedding = PatchEmbedding(patch_size, hidden_dim, dtype=policy,
                                              name="patch_embedding")
        self.image_position_embedding = LearnedPositionEmbedding(
            num_patches, dtype=policy, name="image_position_embedding"
        )
        self.resampler = _resampler(resampler, policy)
        self.type_embedding = keras.layers.Embedding(2, hidden_dim, dtype=policy,
                                                     name="type_embedding")
        self.image_dropout = keras.layers.Dropout(dropout, dtype=policy, name="image_dropout")
        self.transformer_stack = TransformerStack(template, num_layers, dtype=policy,
                                                  name="transformer_stack")
        self.pooling = Pooling(pooling, dtype=policy, name="pooling")
        self.head = None
        if num_classes is not None:
            self.head = ClassificationHead(num_classes, intermediate_dim=head_intermediate_dim,
                                           dropout=head_dropout, dtype=policy, name="head")

        # Functional model
        inputs = {
            **token_inputs(),
            "images": keras.Input(shape=image_shape, dtype="float32", name="images"),
        }
        token_ids = inputs["token_ids"]
        text = self.text_embedding(token_ids)
        text = text + self.type_embedding(ops.zeros_like(token_ids))
        patches = self.patch_embedding(inputs["images"])
        patches = patches + self.image_position_embedding(patches)
        if self.resampler is not None:
            patches = self.resampler(patches)
        image_types = ops.ones_like(patches[..., 0], dtype="int32")
        patches = self.image_dropout(patches + self.type_embedding(image_types))
        hidden = ops.concatenate([text, patches], axis=1)
        mask = ops.concatenate(
            [ops.cast(inputs["padding_mask"], "bool"), ops.ones_like(image_types, dtype="bool")],
            axis=1,
        )
        sequence = self.transformer_stack(hidden, padding_mask=mask)
        pooled = self.pooling(sequence, padding_mask=mask)
        if self.head is None:
            outputs = {"sequence_output": sequence, "pooled_output": pooled}
        else:
            outputs = self.head(pooled)
        super().__init__(inputs=inputs, outputs=outputs, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(),
                      attributes={"pooling": "pooling_mode", "resampler": "resampler_config"})

    @property
    def num_image_tokens(self):
        """Image positions in the encoder: the `N` patches, or the resampler's `r` latents."""
        if self.resampler is not None:
            return self.resampler.num_latents
        height, width, _ = self.image_shape
        return (height // self.patch_size) * (width // self.patch_size)

    def feature_extractor(self):
        """A model sharing these layers: the same inputs, outputs `{"sequence_output",
        "pooled_output"}`."""
        return keras.Model(self.input, {"sequence_output": self.transformer_stack.output,
                                        "pooled_output": self.pooling.output})

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile`; with `num_classes`, defaults to AdamW, sparse cross-entropy on
        logits and accuracy."""
        if self.num_classes is None:
            loss = None if loss == "auto" else loss
            metrics = None if metrics == "auto" else metrics
        optimizer, loss, metrics = classifier_compile_defaults(optimizer, loss, metrics)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
