"""Inference that computes only the layers a `LayerSkippingClassifier`'s gates run (§5.6)."""

import keras
from keras import ops

from keras_xf.models.adaptive.adaptive_encoder import AdaptiveEncoder
from keras_xf.models.adaptive.layer_skip_control import LayerSkipControl
from keras_xf.models.backbones.arguments import check_model_inputs
from keras_xf.ops.checks import check_probability


@keras.saving.register_keras_serializable(package="keras_xf")
class LayerSkippingPredictor(keras.Model):
    """The layers of a `LayerSkippingClassifier`, each computed only when an input needs it.

    Before layer `l`, its gate decides for every input whether the layer runs
    (`p_l ≥ τ`, survey §5.6); an input for which it does not keeps its state `s^{l−1}`.
    The logits equal those of the classifier at inference.

    How computation is skipped under static shapes: the classifier's stack runs its layers
    under a `LayerSkipControl` (`TransformerStack.run_layers`), each inside
    `keras.ops.cond`, whose branch is not executed when no input of the batch runs the layer
    (`lax.cond` under XLA, `tf.cond` in a `tf.function`, a Python branch in eager PyTorch),
    so a batch costs the layers that at least one of its inputs runs. A row that skips a
    layer that others run is computed with them and passes the layer as the identity
    (shapes cannot shrink under XLA); predicting with `batch_size=1` gives every input its
    own depth.

    Args:
        classifier: a `LayerSkippingClassifier`.
        threshold: optional float `τ` in `[0, 1]` in place of the classifier's.

    Outputs: `{"logits": float32 [B, C], "executed_layers": bool [B, L] (whether layer `l`
    ran for each input), "num_executed_layers": int32 [B]}`.

    Example:
    >>> fast = classifier.layer_skipping_predictor(threshold=0.6)
    >>> result = fast.predict(inputs, batch_size=1)
    >>> result["num_executed_layers"].mean()  # layers executed on average
    """

    def __init__(self, classifier, threshold=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(classifier, dict):
            classifier = keras.saving.deserialize_keras_object(classifier)
        if not isinstance(classifier, AdaptiveEncoder) or classifier.gates is None:
            raise ValueError(
                "classifier must be a LayerSkippingClassifier. Received: "
                f"classifier={type(classifier).__name__}"
            )
        self.classifier = classifier
        self.threshold = None if threshold is None else check_probability("threshold", threshold)
        self.built = True

    def call(self, inputs, training=False):
        model = self.classifier
        check_model_inputs(model, inputs)
        mask = ops.cast(inputs["padding_mask"], "bool")
        control = LayerSkipControl(model.gates, mask, threshold=self.threshold,
                                   skip_computation=True)
        result = model.run_layers(inputs, control)
        executed = ops.stack(result["control"]["executed"], axis=1)
        logits = model.head(model.pooling(result["outputs"], padding_mask=mask))
        return {
            "logits": ops.cast(logits, "float32"),
            "executed_layers": executed,
            "num_executed_layers": ops.sum(ops.cast(executed, "int32"), axis=1),
        }

    def compute_output_spec(self, inputs, training=False):
        batch = inputs["token_ids"].shape[0]
        return {
            "logits": keras.KerasTensor((batch, self.classifier.num_classes), dtype="float32"),
            "executed_layers": keras.KerasTensor((batch, len(self.classifier.gates)),
                                                 dtype="bool"),
            "num_executed_layers": keras.KerasTensor((batch,), dtype="int32"),
        }

    def get_config(self):
        config = super().get_config()
        config.update({
            "classifier": keras.saving.serialize_keras_object(self.classifier),
            "threshold": self.threshold,
        })
        return config
