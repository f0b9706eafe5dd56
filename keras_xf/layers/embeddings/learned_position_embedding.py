"""Learned absolute position embeddings (survey §2.2)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class LearnedPositionEmbedding(keras.layers.Layer):
    """A trainable table `P ∈ R^{L×d}`; position `j` is represented by the row `P[j]`.

    Positions at or beyond `sequence_length` have no row. A static input length longer than
    the table raises a `ValueError` at build or trace time instead of reading out of range.

    Args:
        sequence_length: int, the number of rows `L` (the longest supported sequence).
        initializer: initializer for the table.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]` embeddings (only the shape is used).
        start_index: int or scalar tensor, position of the first token (for cached decoding).
            A tensor start reads rows `P[start + j]`, `j < T`, which must lie in the table.

    Returns:
        `[B, T, d]` position embeddings.

    Example:
    >>> x = keras.random.normal((2, 10, 16))
    >>> x = x + LearnedPositionEmbedding(sequence_length=32)(x)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.initializer = get_initializer("initializer", initializer)

    def _check_length(self, length, start_index=0):
        if isinstance(length, int) and isinstance(start_index, int):
            if start_index + length > self.sequence_length:
                raise ValueError(
                    "The input is longer than the position table. Received: positions up to "
                    f"{start_index + length - 1} with sequence_length={self.sequence_length}"
                )

    def build(self, inputs_shape):
        if len(inputs_shape) != 3:
            raise ValueError(
                "LearnedPositionEmbedding expects inputs of rank 3 [batch, length, dim]. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        self._check_length(inputs_shape[1])
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs, start_index=0):
        check_sequence_width(inputs, self.position_embeddings.shape[-1])
        self._check_length(inputs.shape[1], start_index)
        shape = ops.shape(inputs)
        table = ops.cast(self.position_embeddings, self.compute_dtype)
        if isinstance(start_index, int):
            # A plain slice also for symbolic lengths (torch.export cannot trace a tensor start).
            rows = table[start_index : start_index + shape[1]]
        else:
            # Rows `start + arange(T)` gathered: torch.export and ONNX capture a gather at a
            # tensor start (a slice there has a size they cannot bound); XLA fuses either.
            positions = ops.arange(shape[1], dtype="int32") + ops.cast(start_index, "int32")
            rows = ops.take(table, positions, axis=0)
        return ops.broadcast_to(rows[None], shape)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
