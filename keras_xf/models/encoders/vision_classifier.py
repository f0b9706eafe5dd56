"""Vision Transformer image classifier (survey §6.4)."""

import keras

from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import classifier_compile_defaults
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.vision_backbone import VisionBackbone


@keras.saving.register_keras_serializable(package="keras_xf")
class VisionClassifier(FunctionalModel):
    """ViT: `logits = Head(Pool(ViT(image)))` (survey §6.4).

    The image is encoded by a `VisionBackbone` (patch embedding, patch positions, optional
    `[CLS]` token, Transformer encoder); the representation of the image is the encoder
    output at the first position (`pooling="cls"`, the `[CLS]` token) or the mean (or
    maximum) of the patch states, and a classifier maps it to `num_classes` logits.

    Args:
        num_classes: int.
        backbone: a `VisionBackbone`, or its arguments as keywords (`image_shape`,
            `patch_size`, `num_layers`, `hidden_dim`, `num_heads`, `intermediate_dim`,
            `block`, `positions`, `class_token`, ...).
        pooling: `"cls"` (default; needs the `[CLS]` token), `"mean"` or `"max"` over the
            patch states (the `[CLS]` state excluded).
        head_intermediate_dim: optional hidden layer width in the head (tanh pre-logits).
        head_dropout: dropout before the output layer.
        activation: optional output activation; float32 logits by default.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"images": [B, H, W, C]}`. Outputs: float32 `[B, num_classes]`.

    Example:
    >>> vit = VisionClassifier(num_classes=10, image_shape=(8, 8, 1), patch_size=2,
    ...                        num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=64)
    >>> vit.compile()
    >>> vit.fit({"images": images}, labels, epochs=1)
    """

    def __init__(self, num_classes, backbone=None, pooling="cls", head_intermediate_dim=None,
                 head_dropout=0.0, activation=None, name=None, dtype=None, trainable=True,
                 **backbone_kwargs):
        check_model_arguments(locals())
        backbone = task_backbone(backbone, VisionBackbone, dtype, backbone_kwargs)
        if pooling == "cls" and not backbone.use_class_token:
            raise ValueError(
                "pooling='cls' needs a backbone with a [CLS] token. Received: pooling='cls', "
                "class_token=False"
            )

        # Layers
        self.backbone = backbone
        self.pooling = Pooling(pooling, dtype=backbone.dtype_policy, name="pooling")
        self.head = ClassificationHead(
            num_classes,
            intermediate_dim=head_intermediate_dim,
            dropout=head_dropout,
            activation=activation,
            dtype=backbone.dtype_policy,
            name="head",
        )

        # Functional model
        inputs = {"images": keras.Input(shape=backbone.image_shape, name="images")}
        hidden = backbone(inputs)
        if pooling != "cls" and backbone.num_prefix_tokens:
            hidden = hidden[:, backbone.num_prefix_tokens :, :]
        logits = self.head(self.pooling(hidden))
        super().__init__(inputs=inputs, outputs=logits, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(), attributes={"backbone": None, "pooling": "pooling_mode"})

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile` with defaults: AdamW, sparse cross-entropy on logits, accuracy."""
        optimizer, loss, metrics = classifier_compile_defaults(
            optimizer, loss, metrics, from_logits=self.activation is None, weight_decay=0.05
        )
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
