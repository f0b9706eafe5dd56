"""Training the stop classifier of early-exit generation on a frozen language model (§5.6)."""

import keras
from keras import ops

from keras_xf.models.backbones.arguments import check_model_inputs
from keras_xf.models.generative.generative_task import GenerativeTask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import token_sample_weight
from keras_xf.ops.exit_criteria import stop_labels
from keras_xf.training.chunked_loss_model import ChunkedLossModel


@keras.saving.register_keras_serializable(package="keras_xf")
class StopClassifierTrainer(keras.Model):
    """Trains a `StopClassifier` `f_stop` with `fit` on the top-layer states `s_i` of a frozen
    language model (survey §5.6, `Pr(c | s_i) = f_stop(s_i)`, `c ∈ {stop, nonstop}`).

    The labels come from the token batches themselves (`keras_xf.ops.stop_labels`): position
    `i` is "stop" where the sequence ends at `i` (the next position holds `end_token_id` or
    is padding), "nonstop" elsewhere; the end token, what follows it and padding carry no
    label. The loss is the binary cross-entropy of the stop logits in float32, averaged over
    the labelled positions (times a `sample_weight` given to `fit`):

        L = Σ_i w_i · BCE(c_i, σ(z_i)) / Σ_i w_i.

    The language model is frozen (`lm.trainable = False`, as `keras.distillation` freezes a
    teacher) and runs in inference mode; the trainable weights are the classifier's. After
    `fit`, pass the classifier to `lm.generate(..., stop_classifier=classifier)`.

    Args:
        lm: a `GenerativeTask` whose top-layer states train with it (`CausalLM`).
        stop_classifier: a `StopClassifier` (built here for the model's width if need be).
        end_token_id: optional int, the id that ends a sequence in the training data.
        **kwargs: `keras.Model` arguments (`name`).

    Inputs: the model's inputs (`{"token_ids", "padding_mask"}`); `fit(x)` takes no `y`.
    Outputs: float32 stop logits `[B, T]`.

    Example:
    >>> classifier = StopClassifier()
    >>> trainer = StopClassifierTrainer(lm, classifier, end_token_id=2)
    >>> trainer.compile(optimizer="adam")
    >>> trainer.fit(batches, epochs=1)
    >>> lm.generate(prompts, stop_classifier=classifier, stop_margin=0.2)
    """

    def __init__(self, lm, stop_classifier, end_token_id=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(lm, dict):
            lm = keras.saving.deserialize_keras_object(lm)
        if isinstance(stop_classifier, dict):
            stop_classifier = keras.saving.deserialize_keras_object(stop_classifier)
        if not isinstance(lm, GenerativeTask) or not isinstance(lm, ChunkedLossModel):
            raise ValueError(
                "lm must be a GenerativeTask whose top-layer states it trains with "
                f"(CausalLM). Received: lm={type(lm).__name__}"
            )
        lm._build_stop_classifier(stop_classifier)
        if end_token_id is not None:
            end_token_id = check_positive_int("end_token_id", end_token_id, minimum=0)
            vocabulary = lm._output_embeddings.vocabulary_size
            if end_token_id >= vocabulary:
                raise ValueError(f"end_token_id must be an id in [0, {vocabulary}). Received: "
                                 f"end_token_id={end_token_id}")
        lm.trainable = False
        self.lm = lm
        self.stop_classifier = stop_classifier
        self.end_token_id = end_token_id
        self.built = True

    def compile(self, optimizer="adam", **kwargs):
        """Keras `compile`; the loss is the trainer's own (see the class docstring)."""
        if kwargs.get("loss") is not None:
            raise ValueError(
                "StopClassifierTrainer computes its own loss from the token ids. Received: "
                f"loss={kwargs['loss']!r}"
            )
        super().compile(optimizer=optimizer, **kwargs)

    def call(self, inputs, training=False):
        check_model_inputs(self.lm, inputs)
        hidden = ops.stop_gradient(self.lm.final_hidden_states(inputs, training=False))
        return self.stop_classifier(hidden, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if y is not None:
            raise ValueError(
                "StopClassifierTrainer derives its labels from the token ids: call fit(x) "
                "without y. Received: y of type " + type(y).__name__
            )
        ids_key, mask_key = self.lm.prompt_keys
        labels, counted = stop_labels(x[ids_key], x.get(mask_key), self.end_token_id)
        weights = ops.cast(counted, "float32")
        if sample_weight is not None:
            weights = weights * token_sample_weight(sample_weight, labels.shape)
        losses = ops.binary_crossentropy(labels, ops.cast(y_pred, "float32"), from_logits=True)
        loss = ops.sum(losses * weights) / ops.maximum(ops.sum(weights), 1.0)
        for extra in self.losses:
            loss = loss + ops.cast(extra, "float32")
        return loss

    def compute_output_spec(self, inputs, training=False):
        ids = inputs[self.lm.prompt_keys[0]]
        return keras.KerasTensor(tuple(ids.shape[:2]), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "lm": keras.saving.serialize_keras_object(self.lm),
            "stop_classifier": keras.saving.serialize_keras_object(self.stop_classifier),
            "end_token_id": self.end_token_id,
        })
        return config
