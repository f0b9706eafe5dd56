"""A classification head on pooled (or per-token) representations."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_activation


@keras.saving.register_keras_serializable(package="keras_xf")
class ClassificationHead(keras.layers.Layer):
    """`logits = W_o · dropout(act(W_h x + b_h)) + b_o`, or `W_o · dropout(x) + b_o`.

    The optional hidden layer follows BERT's pooler (tanh). Logits are returned in float32 so
    that losses run in float32 under mixed precision.

    Args:
        num_classes: int.
        intermediate_dim: optional int, width of a hidden layer.
        intermediate_activation: activation of the hidden layer (`"tanh"` by default).
        dropout: float in [0, 1), dropout before the output layer.
        activation: optional output activation (e.g. `"softmax"`); logits by default.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, d]` or `[B, T, d]`.
        training: bool.

    Returns:
        float32 `[..., num_classes]`.

    Example:
    >>> ClassificationHead(3)(keras.random.normal((2, 16))).shape  # (2, 3)
    """

    def __init__(
        self,
        num_classes,
        intermediate_dim=None,
        intermediate_activation="tanh",
        dropout=0.0,
        activation=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_classes = check_positive_int("num_classes", num_classes)
        if intermediate_dim is not None:
            intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        get_activation("intermediate_activation", intermediate_activation)
        self.num_classes = num_classes
        self.intermediate_dim = intermediate_dim
        self.intermediate_activation = intermediate_activation
        self.dropout = dropout
        self.activation = activation
        self.hidden_dense = None
        if intermediate_dim is not None:
            self.hidden_dense = keras.layers.Dense(
                intermediate_dim,
                activation=intermediate_activation,
                dtype=self.dtype_policy,
                name="hidden",
            )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.output_dense = keras.layers.Dense(num_classes, dtype=self.dtype_policy, name="logits")
        self.output_activation = get_activation("activation", activation)

    def build(self, inputs_shape):
        shape = tuple(inputs_shape)
        if self.hidden_dense is not None:
            self.hidden_dense.build(shape)
            shape = shape[:-1] + (self.intermediate_dim,)
        self.output_dense.build(shape)

    def call(self, inputs, training=None):
        dense = self.output_dense if self.hidden_dense is None else self.hidden_dense
        check_width(inputs, dense.kernel.shape[0])
        hidden = inputs
        if self.hidden_dense is not None:
            hidden = self.hidden_dense(hidden)
        hidden = self.dropout_layer(hidden, training=training)
        logits = ops.cast(self.output_dense(hidden), "float32")
        return self.output_activation(logits)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.num_classes,)

    def compute_output_spec(self, inputs, training=None):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_classes": self.num_classes,
                "intermediate_dim": self.intermediate_dim,
                "intermediate_activation": self.intermediate_activation,
                "dropout": self.dropout,
                "activation": self.activation,
            }
        )
        return config
