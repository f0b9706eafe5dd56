"""Inference that stops at the first confident exit of an `EarlyExitClassifier` (§5.6)."""

import keras
from keras import ops

from keras_xf.models.adaptive.adaptive_encoder import AdaptiveEncoder
from keras_xf.models.adaptive.early_exit_control import EarlyExitControl
from keras_xf.models.backbones.arguments import check_model_inputs
from keras_xf.ops.exit_criteria import check_exit_rule


@keras.saving.register_keras_serializable(package="keras_xf")
class EarlyExitPredictor(keras.Model):
    """The layers of an `EarlyExitClassifier`, run until every input has exited.

    The depth grows layer by layer as usual (survey §5.6); at each exit `l` the exit's
    classifier gives `p^l`, and an input stops at the first exit where `criterion` holds
    (the last exit always stops):

    - `"entropy"`: `H(p^l) ≤ threshold`;
    - `"max_probability"`: `max_k p^l_k ≥ threshold`;
    - `"state_similarity"`: `cos(s^{l'}, s^l) ≥ threshold` for the pooled states of this
      exit and the previous one (the embeddings before the first exit);
    - `"patience"`: the prediction unchanged over `threshold` consecutive exits.

    An input's answer is its exit's logits, frozen once it has exited.

    How computation stops under static shapes: the classifier's stack runs its layers
    under an `EarlyExitControl` (`TransformerStack.run_layers`), each inside
    `keras.ops.cond`, whose branch is skipped when every input of the batch has exited
    (`lax.cond` under XLA, `tf.cond` in a `tf.function`, a Python branch in eager PyTorch),
    so a batch costs the layers of its deepest input. A row that exits early in a batch that
    continues has its result and state frozen but is still computed with the others (shapes
    cannot shrink under XLA); predicting with `batch_size=1` stops every input at its own
    exit.

    Args:
        classifier: an `EarlyExitClassifier`.
        criterion: one of `"entropy"`, `"max_probability"`, `"state_similarity"`,
            `"patience"`.
        threshold: the criterion's threshold: a number (entropy in nats, a probability, a
            cosine), or for `"patience"` an int `k ≥ 1`.

    Outputs: `{"logits": float32 [B, C], "exit_layer": int32 [B]}`, the layer number (1 … L)
    at which each input exited: the number of layers computed for it.

    Example:
    >>> fast = classifier.early_exit_predictor("entropy", threshold=0.3)
    >>> result = fast.predict(inputs, batch_size=1)
    >>> result["exit_layer"].mean()  # layers executed on average
    """

    def __init__(self, classifier, criterion, threshold, **kwargs):
        super().__init__(**kwargs)
        if isinstance(classifier, dict):
            classifier = keras.saving.deserialize_keras_object(classifier)
        if not isinstance(classifier, AdaptiveEncoder) or classifier.exit_layers is None:
            raise ValueError(
                "classifier must be an EarlyExitClassifier. Received: "
                f"classifier={type(classifier).__name__}"
            )
        check_exit_rule(criterion, threshold)
        self.classifier = classifier
        self.criterion = criterion
        self.threshold = threshold
        self.built = True

    def call(self, inputs, training=False):
        model = self.classifier
        check_model_inputs(model, inputs)
        mask = ops.cast(inputs["padding_mask"], "bool")

        def read_state(hidden):
            return ops.cast(model.pooled_state(hidden, mask), "float32")

        def read_exit(exit_index, hidden):
            states = read_state(hidden)
            return model.exit_logits(exit_index, hidden, mask, pooled=states), states

        control = EarlyExitControl(model.exit_layers, len(model.blocks), model.num_classes,
                                   read_exit, read_state, rule=(self.criterion, self.threshold))
        carry = model.run_layers(inputs, control)["control"]
        return {"logits": carry["logits"], "exit_layer": carry["exit_layer"]}

    def compute_output_spec(self, inputs, training=False):
        batch = inputs["token_ids"].shape[0]
        return {
            "logits": keras.KerasTensor((batch, self.classifier.num_classes), dtype="float32"),
            "exit_layer": keras.KerasTensor((batch,), dtype="int32"),
        }

    def get_config(self):
        config = super().get_config()
        config.update({
            "classifier": keras.saving.serialize_keras_object(self.classifier),
            "criterion": self.criterion,
            "threshold": self.threshold,
        })
        return config
