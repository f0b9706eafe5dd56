"""Sequence classifier whose encoder layers are each run or skipped per input (survey §5.6)."""

import keras
from keras import ops

from keras_xf.layers.blocks.layer_skip_gate import LayerSkipGate
from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.adaptive.adaptive_encoder import AdaptiveEncoder
from keras_xf.models.adaptive.layer_skip_control import LayerSkipControl
from keras_xf.models.adaptive.layer_skipping_predictor import LayerSkippingPredictor
from keras_xf.models.backbones.arguments import check_adaptive_backbone
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import classifier_compile_defaults
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone


@keras.saving.register_keras_serializable(package="keras_xf")
class LayerSkippingClassifier(AdaptiveEncoder):
    """`logits = Head(Pool(Norm(s^L)))` with `s^l = s^{l−1} + g_l · (Layer^l(s^{l−1}) − s^{l−1})`.

    An encoder classifier in which a learned `LayerSkipGate` before each layer decides, per
    input sequence, whether the layer runs or is skipped (survey §5.6, skipping models):
    `g_l = 1[p_l ≥ τ]` with `p_l = σ(w_l · mean_j s^{l−1}_j + b_l)`. Trained with `fit`
    (straight-through or soft gates, see `LayerSkipGate`); each gate adds the compute
    penalty `λ · mean_b p_l` to the model's losses, so the task loss is traded against the
    expected number of layers run. The functional model computes every layer and selects;
    `layer_skipping_predictor` gives the model that does not compute the skipped layers.
    The layers run through the stack's runner under a `LayerSkipControl`
    (`TransformerStack.run_layers`), so every option of the stack applies: a gated layer's
    output is combined by layer drop, multi-step residuals or fusion like any layer's, and
    a skipped layer is the identity (increment 0).

    Args:
        num_classes: int.
        backbone: a non-causal `TransformerBackbone` whose stack is a `TransformerStack`
            (any options; not reversible), or its arguments as keywords.
        threshold: float `τ` in `[0, 1]`: layer `l` runs for an input when `p_l ≥ τ`.
        gate: `"straight_through"` (default) or `"multiply"` (see `LayerSkipGate`).
        compute_loss_weight: float `λ ≥ 0`, each gate's penalty weight.
        initial_bias: float, each gate's starting bias (`2.0`: every layer runs at first).
        pooling: `"cls"`, `"mean"` (default) or `"max"`.
        head_intermediate_dim: optional hidden layer width in the head.
        head_dropout: dropout before the output layer.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids", "padding_mask"}` (and `"segment_ids"` when the backbone takes
    them). Outputs: float32 logits `[B, num_classes]`.

    Example:
    >>> model = LayerSkippingClassifier(num_classes=3, vocabulary_size=100, num_layers=4,
    ...                                 hidden_dim=16, num_heads=2, intermediate_dim=32,
    ...                                 compute_loss_weight=0.05)
    >>> model.compile()  # cross-entropy + the gates' penalties
    >>> fast = model.layer_skipping_predictor()
    """

    def __init__(self, num_classes, backbone=None, threshold=0.5, gate="straight_through",
                 compute_loss_weight=0.01, initial_bias=2.0, pooling="mean",
                 head_intermediate_dim=None, head_dropout=0.0, name=None, dtype=None,
                 trainable=True, **backbone_kwargs):
        check_model_arguments(locals())
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs)
        check_adaptive_backbone(backbone)

        # Layers
        self.backbone = backbone
        self.gates = [
            LayerSkipGate(threshold=threshold, gate=gate,
                          compute_loss_weight=compute_loss_weight, initial_bias=initial_bias,
                          dtype=backbone.dtype_policy, name=f"skip_gate_{index}")
            for index in range(backbone.num_layers)
        ]
        self.pooling = Pooling(pooling, dtype=backbone.dtype_policy, name="pooling")
        self.head = ClassificationHead(num_classes, intermediate_dim=head_intermediate_dim,
                                       dropout=head_dropout, dtype=backbone.dtype_policy,
                                       name="head")

        # Functional model
        inputs = token_inputs(segments=backbone.uses_segment_ids)
        mask = ops.cast(inputs["padding_mask"], "bool")
        outputs = self.run_layers(inputs, LayerSkipControl(self.gates, mask))["outputs"]
        logits = self.head(self.pooling(outputs, padding_mask=mask))
        super().__init__(inputs=inputs, outputs=logits, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(), attributes={"backbone": None, "pooling": "pooling_mode"})

    def layer_skipping_predictor(self, threshold=None):
        """A `LayerSkippingPredictor` on this model's layers and gates, which runs layer `l`
        for the inputs with `p_l ≥ threshold` only (`None`: the model's `threshold`)."""
        return LayerSkippingPredictor(self, threshold=threshold)

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """Keras `compile` with defaults: AdamW, sparse cross-entropy on logits, accuracy;
        the gates' penalties are added to the loss by Keras (`model.losses`)."""
        optimizer, loss, metrics = classifier_compile_defaults(optimizer, loss, metrics)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
