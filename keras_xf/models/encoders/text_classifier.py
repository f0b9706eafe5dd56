"""Encoder-only sequence classifier (survey §6)."""

import keras

from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import classifier_compile_defaults
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.presets import preset_config
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.models.backbones.transformer_backbone import pooled_states
from keras_xf.preprocessing import TextClassifierPreprocessor


@keras.saving.register_keras_serializable(package="keras_xf")
class TextClassifier(FunctionalModel):
    """`logits = Head(Pool(Encoder(x)))` over the real tokens of each sequence.

    Args:
        num_classes: int.
        backbone: a non-causal `TransformerBackbone`, or its arguments as keywords.
        pooling: `"cls"`, `"mean"` (default) or `"max"`. With `"cls"` the backbone's last
            layer computes the first position alone (its keys and values still span the
            sequence; the logits are the same).
        head_intermediate_dim: optional hidden layer width in the head (BERT-style tanh
            pooler).
        head_dropout: dropout before the output layer.
        activation: optional output activation; float32 logits by default.
        preprocessor: optional `keras_xf.preprocessing.TextClassifierPreprocessor`; with it
            `fit`, `evaluate` and `predict` also take texts (and integer labels). `None`
            (default): ids.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids", "padding_mask"}` (and `"segment_ids"` when the backbone takes
    them). Outputs: float32 `[B, num_classes]`.

    Example:
    >>> clf = TextClassifier(num_classes=2, vocabulary_size=100, num_layers=1, hidden_dim=16,
    ...                      num_heads=2, intermediate_dim=32)
    """

    preprocessor_class = TextClassifierPreprocessor

    def __init__(self, num_classes, backbone=None, pooling="mean", head_intermediate_dim=None,
                 head_dropout=0.0, activation=None, preprocessor=None, name=None, dtype=None,
                 trainable=True, **backbone_kwargs):
        check_model_arguments(locals())
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs)

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
        inputs = token_inputs(segments=backbone.uses_segment_ids)
        pooled = pooled_states(backbone, self.pooling, inputs)
        logits = self.head(pooled)
        super().__init__(inputs=inputs, outputs=logits, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(), attributes={"backbone": None, "pooling": "pooling_mode"})
        self.preprocessor = preprocessor

    @classmethod
    def from_preset(cls, preset, num_classes, **overrides):
        """An untrained classifier with a named encoder architecture, e.g. `"bert_base"`."""
        return cls(num_classes=num_classes, **preset_config(preset, "text_classifier", **overrides))

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile` with defaults: AdamW, sparse cross-entropy on logits, accuracy."""
        optimizer, loss, metrics = classifier_compile_defaults(
            optimizer, loss, metrics, from_logits=self.activation is None
        )
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
