"""The stop / non-stop classifier of early-exit generation (survey §5.6)."""

import keras
from keras import ops

from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.ops.checks import check_sequence_width


@keras.saving.register_keras_serializable(package="keras_xf")
class StopClassifier(keras.layers.Layer):
    """`Pr(stop | s_i) = σ(z_i)`, `z_i = w_o · act(W_h s_i + b_h) + b_o` (or `w_o · s_i + b_o`
    without the hidden layer), `Pr(nonstop | s_i) = 1 − σ(z_i)`: the model `f_stop` of
    early-exit generation (survey §5.6), read at the top layer's state `s_i` of each position.

    Generation ends a row at `i` once `Pr(stop|s_i) ≥ Pr(nonstop|s_i) + θ_stop`
    (`GenerativeTask.generate(stop_classifier=..., stop_margin=θ_stop)`, the rule of
    `keras_xf.ops.stop_by_margin`). The layer gives one stop logit `z_i` per position rather
    than two class logits: a softmax over two logits depends on their difference only, so one
    logit is the same family of distributions with no redundant weight, and it trains with a
    binary cross-entropy against `keras_xf.ops.stop_labels` (`StopClassifierTrainer`).

    Args:
        intermediate_dim: optional int, the width of a hidden layer.
        intermediate_activation: the activation of the hidden layer (`"relu"` by default).
        dropout: float in [0, 1), dropout before the output layer.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`, top-layer hidden states.
        training: bool.

    Returns:
        float32 `[B, T]`, the stop logits `z_i` (`stop_probability` gives `σ(z_i)`).

    Example (trained with `StopClassifierTrainer`, then
    `lm.generate(prompts, stop_classifier=classifier, stop_margin=0.2)`):
    >>> classifier = StopClassifier(intermediate_dim=32)
    >>> classifier(keras.random.normal((2, 5, 16))).shape  # (2, 5)
    """

    def __init__(self, intermediate_dim=None, intermediate_activation="relu", dropout=0.0,
                 **kwargs):
        super().__init__(**kwargs)
        # ClassificationHead checks the three arguments and names them.
        self.head = ClassificationHead(
            1, intermediate_dim=intermediate_dim,
            intermediate_activation=intermediate_activation, dropout=dropout,
            dtype=self.dtype_policy, name="head",
        )
        self.intermediate_dim = self.head.intermediate_dim
        self.intermediate_activation = intermediate_activation
        self.dropout = dropout

    def build(self, inputs_shape):
        check_sequence_width(keras.KerasTensor(inputs_shape))
        self.head.build(inputs_shape)

    @property
    def input_dim(self):
        """The width `d` of the states the layer was built for (`None` before `build`)."""
        if not self.built:
            return None
        dense = self.head.output_dense if self.head.hidden_dense is None else self.head.hidden_dense
        return int(dense.kernel.shape[0])

    def call(self, inputs, training=None):
        check_sequence_width(inputs, self.input_dim)
        return self.head(inputs, training=training)[..., 0]

    def stop_probability(self, inputs):
        """`Pr(stop | s_i) = σ(z_i)`, float32 `[B, T]`, in inference mode."""
        return ops.sigmoid(self(inputs, training=False))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1])

    def compute_output_spec(self, inputs, training=None):
        check_sequence_width(inputs, self.input_dim)
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "intermediate_dim": self.intermediate_dim,
            "intermediate_activation": self.intermediate_activation,
            "dropout": self.dropout,
        })
        return config
