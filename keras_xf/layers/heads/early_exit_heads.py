"""The output layers of an early-exit model, one per exit or shared (survey §5.6)."""

import keras

from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.ops.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_xf")
class EarlyExitHeads(keras.layers.Layer):
    """`logits^l = s^l · W_o^l` for each exit `l` (survey §5.6, early exit classifiers).

    Holds one `ClassificationHead` per exit (`W_o^l`), or one shared by every exit
    (`shared=True`: fewer weights, the exits' states must then speak one "language").

    Args:
        num_exits: int, the number of exits `E`.
        num_classes: int.
        shared: bool, one output layer for every exit.
        intermediate_dim: optional hidden layer width in each head.
        dropout: dropout before each output layer.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, d]` (or `[B, T, d]`), the state of exit `exit_index`.
        exit_index: int in `[0, E)`, which exit.
        training: bool.

    Returns:
        float32 `[..., num_classes]`.

    Example:
    >>> heads = EarlyExitHeads(num_exits=4, num_classes=3)
    >>> heads(keras.random.normal((2, 16)), exit_index=1).shape  # (2, 3)
    """

    def __init__(self, num_exits, num_classes, shared=False, intermediate_dim=None,
                 dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_exits = check_positive_int("num_exits", num_exits)
        if not isinstance(shared, bool):
            raise ValueError(f"shared must be a bool. Received: shared={shared!r}")
        self.num_classes = num_classes
        self.shared = shared
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.heads = [
            ClassificationHead(num_classes, intermediate_dim=intermediate_dim, dropout=dropout,
                               dtype=self.dtype_policy, name=f"exit_{index}")
            for index in range(1 if shared else num_exits)
        ]

    def build(self, inputs_shape):
        for head in self.heads:
            head.build(inputs_shape)

    def _head(self, exit_index):
        if isinstance(exit_index, bool) or not isinstance(exit_index, int) or not (
                0 <= exit_index < self.num_exits):
            raise ValueError(
                f"exit_index must be an int in [0, {self.num_exits}). Received: "
                f"exit_index={exit_index!r}"
            )
        return self.heads[0 if self.shared else exit_index]

    def call(self, inputs, exit_index, training=None):
        return self._head(exit_index)(inputs, training=training)

    def compute_output_shape(self, inputs_shape, exit_index=0):
        return tuple(inputs_shape[:-1]) + (self.num_classes,)

    def compute_output_spec(self, inputs, exit_index=0, training=None):
        self._head(exit_index)
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({"num_exits": self.num_exits, "num_classes": self.num_classes,
                       "shared": self.shared, "intermediate_dim": self.intermediate_dim,
                       "dropout": self.dropout})
        return config
