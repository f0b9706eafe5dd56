"""Sequence classifier with early-exit classifiers on chosen layers (survey §5.6)."""

import keras
from keras import ops

from keras_xf.layers.blocks.layer_state_reader import LayerStateReader
from keras_xf.layers.heads.early_exit_heads import EarlyExitHeads
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.adaptive.adaptive_encoder import AdaptiveEncoder
from keras_xf.models.adaptive.early_exit_predictor import EarlyExitPredictor
from keras_xf.models.backbones.arguments import check_adaptive_backbone
from keras_xf.models.backbones.arguments import check_exit_heads
from keras_xf.models.backbones.arguments import check_exit_layers
from keras_xf.models.backbones.arguments import check_exit_loss_weights
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import classifier_compile_defaults
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.training.early_exit_loss import EarlyExitLoss
from keras_xf.training.early_exit_loss import final_exit_accuracy


@keras.saving.register_keras_serializable(package="keras_xf")
class EarlyExitClassifier(AdaptiveEncoder):
    """`p^l = Softmax(Head^l(Pool(s^l)))` at each exit layer `l` of an encoder.

    An encoder classifier whose chosen layers each carry an early-exit classifier (survey
    §5.6): the state `s^l` after layer `l` (normalised by the stack's final norm when it has
    one, as the last layer's is) is pooled and classified. Trained with `fit` on the
    weighted sum of the exits' cross-entropy losses (`EarlyExitLoss`, the default of
    `compile`); `early_exit_predictor` gives the model that stops computing once an exit
    criterion is met. The layers run through the stack's runner
    (`TransformerStack.run_layers`), so every option of the stack applies: `s^l` is the
    input of the next layer (after layer drop, multi-step residuals or fusion), shared and
    hybrid layers run as in the stack.

    Args:
        num_classes: int.
        backbone: a non-causal `TransformerBackbone` whose stack is a `TransformerStack`
            (any options; not reversible), or its arguments as keywords.
        exit_layers: optional list of increasing layer numbers `1 … L` carrying an exit; it
            must end with the last layer `L` (the model's final prediction). Default: every
            layer.
        exit_heads: `"per_layer"` (default: an output layer per exit, `W_o^l`) or
            `"shared"` (one output layer for every exit).
        exit_loss_weights: optional list of non-negative floats, one per exit: their weights
            in the training loss (`None`: 1 each).
        pooling: `"cls"`, `"mean"` (default) or `"max"`.
        head_intermediate_dim: optional hidden layer width in each head.
        head_dropout: dropout before each output layer.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids", "padding_mask"}` (and `"segment_ids"` when the backbone takes
    them). Outputs: float32 logits of every exit, `[B, E, num_classes]`, the last exit last.

    Example:
    >>> model = EarlyExitClassifier(num_classes=3, vocabulary_size=100, num_layers=4,
    ...                             hidden_dim=16, num_heads=2, intermediate_dim=32)
    >>> model.compile()  # EarlyExitLoss over the 4 exits, accuracy of the last
    >>> fast = model.early_exit_predictor("max_probability", threshold=0.9)
    """

    def __init__(self, num_classes, backbone=None, exit_layers=None, exit_heads="per_layer",
                 exit_loss_weights=None, pooling="mean", head_intermediate_dim=None,
                 head_dropout=0.0, name=None, dtype=None, trainable=True, **backbone_kwargs):
        check_model_arguments(locals())
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs)
        check_adaptive_backbone(backbone)
        exit_layers = check_exit_layers(exit_layers, backbone.num_layers)
        check_exit_heads(exit_heads)
        exit_loss_weights = check_exit_loss_weights(exit_loss_weights, len(exit_layers))

        # Layers
        self.backbone = backbone
        self.pooling = Pooling(pooling, dtype=backbone.dtype_policy, name="pooling")
        self.heads = EarlyExitHeads(len(exit_layers), num_classes,
                                    shared=exit_heads == "shared",
                                    intermediate_dim=head_intermediate_dim, dropout=head_dropout,
                                    dtype=backbone.dtype_policy, name="exit_heads")

        # Functional model
        inputs = token_inputs(segments=backbone.uses_segment_ids)
        mask = ops.cast(inputs["padding_mask"], "bool")
        reader = LayerStateReader(
            exit_layers, lambda exit_index, state: self.exit_logits(exit_index, state, mask))
        logits = self.run_layers(inputs, reader)["control"]["values"]
        outputs = ops.stack(logits, axis=1)
        super().__init__(inputs=inputs, outputs=outputs, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(), attributes={"backbone": None, "pooling": "pooling_mode"})

    def exit_logits(self, exit_index, hidden, mask, pooled=None):
        """Float32 logits `[B, C]` of exit number `exit_index` (0-based) on the layer
        output `hidden`."""
        if pooled is None:
            pooled = self.pooled_state(hidden, mask)
        return self.heads(pooled, exit_index=exit_index)

    def early_exit_predictor(self, criterion, threshold):
        """An `EarlyExitPredictor` on this model's layers: it stops at the first exit whose
        `criterion` (`"entropy"`, `"max_probability"`, `"state_similarity"` or
        `"patience"`) passes `threshold`."""
        return EarlyExitPredictor(self, criterion=criterion, threshold=threshold)

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile` with defaults: AdamW, `EarlyExitLoss` with `exit_loss_weights`,
        the last exit's accuracy."""
        if loss == "auto":
            loss = EarlyExitLoss(weights=self.exit_loss_weights)
        if metrics == "auto":
            metrics = [keras.metrics.MeanMetricWrapper(final_exit_accuracy, name="accuracy")]
        optimizer, loss, metrics = classifier_compile_defaults(optimizer, loss, metrics)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

