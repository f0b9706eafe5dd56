"""Single-stream vision-language encoder over text tokens and image patches (survey §6.5, ViLT)."""

import numbers

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
from keras_xf.models.backbone import FunctionalModel
from keras_xf.models.backbone import layer_dtype
from keras_xf.models.block_factory import default_block
from keras_xf.models.block_factory import prepare_block

INPUTS = ("token_ids", "padding_mask", "images")
TEXT, IMAGE = 0, 1


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    return int(value)


def _image_shape(image_shape, patch_size):
    if (
        not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 3
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s <= 0
               for s in image_shape)
    ):
        raise ValueError(
            "image_shape must be three positive ints (height, width, channels). Received: "
            f"image_shape={image_shape!r}"
        )
    height, width, channels = (int(s) for s in image_shape)
    if height % patch_size or width % patch_size:
        raise ValueError(
            "The image height and width must be divisible by patch_size. Received: "
            f"image_shape={(height, width, channels)}, patch_size={patch_size}"
        )
    return height, width, channels


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
        for arg, value in (
            ("vocabulary_size", vocabulary_size),
            ("patch_size", patch_size),
            ("num_layers", num_layers),
            ("hidden_dim", hidden_dim),
            ("max_sequence_length", max_sequence_length),
        ):
            _positive_int(arg, value)
        image_shape = _image_shape(image_shape, patch_size)
        num_patches = (image_shape[0] // patch_size) * (image_shape[1] // patch_size)
        if num_classes is not None:
            _positive_int("num_classes", num_classes)
        if block is None:
            block = default_block(
                num_heads,
                intermediate_dim,
                num_key_value_heads=num_key_value_heads,
                activation=activation,
                norm_placement=norm_placement,
                normalization=normalization,
                dropout=dropout,
            )
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
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
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
        self.vocabulary_size = vocabulary_size
        self.image_shape = image_shape
        self.patch_size = patch_size
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.num_classes = num_classes
        self.pooling_mode = pooling
        self.block = keras.saving.serialize_keras_object(block) if isinstance(
            block, keras.layers.Layer) else block
        self.resampler_config = None if resampler is None else (
            keras.saving.serialize_keras_object(resampler)
            if isinstance(resampler, keras.layers.Layer) else resampler)
        self.num_key_value_heads = num_key_value_heads
        self.activation = activation
        self.norm_placement = norm_placement
        self.normalization = normalization
        self.dropout = dropout
        self.head_intermediate_dim = head_intermediate_dim
        self.head_dropout = head_dropout

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

    def _check_inputs(self, inputs):
        if not isinstance(inputs, dict):
            raise ValueError(
                f"VisionLanguageEncoder expects a dict with keys {INPUTS}. Received: "
                f"inputs of type {type(inputs).__name__}"
            )
        missing = [key for key in INPUTS if inputs.get(key) is None]
        if missing:
            raise ValueError(
                f"VisionLanguageEncoder needs both modalities: inputs {INPUTS}. Missing: "
                f"{missing}. Received: keys={sorted(inputs)}"
            )
        shape = tuple(inputs["images"].shape)
        if len(shape) != 4 or shape[-1] != self.image_shape[-1]:
            raise ValueError(
                f"images must have {self.image_shape[-1]} channels (image_shape="
                f"{self.image_shape}). Received: images.shape={shape}"
            )
        if shape[1:3] != self.image_shape[:2]:
            raise ValueError(
                f"images must be {self.image_shape[0]}×{self.image_shape[1]} (image_shape="
                f"{self.image_shape}). Received: images.shape={shape}"
            )

    def call(self, inputs, training=None, mask=None):
        self._check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile`; with `num_classes`, defaults to AdamW, sparse cross-entropy on
        logits and accuracy."""
        classify = self.num_classes is not None
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if classify \
                else None
        if metrics == "auto":
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")] if classify \
                else None
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "image_shape": list(self.image_shape),
                "patch_size": self.patch_size,
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "max_sequence_length": self.max_sequence_length,
                "num_classes": self.num_classes,
                "pooling": self.pooling_mode,
                "block": self.block,
                "resampler": self.resampler_config,
                "num_key_value_heads": self.num_key_value_heads,
                "activation": self.activation,
                "norm_placement": self.norm_placement,
                "normalization": self.normalization,
                "dropout": self.dropout,
                "head_intermediate_dim": self.head_intermediate_dim,
                "head_dropout": self.head_dropout,
            }
        )
        return config
