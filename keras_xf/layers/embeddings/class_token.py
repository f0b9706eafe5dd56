"""The learnable `[CLS]` token of the Vision Transformer (survey §6.4)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class ClassToken(keras.layers.Layer):
    """Prepends one learned vector `x_cls ∈ R^d` to every sequence: `[x_cls, e_1, …, e_N]`.

    Survey §6.4: the Vision Transformer represents the image by the encoder output at the
    first position; with a `[CLS]` token that position holds no patch, only a learned vector
    that gathers the patches through attention. Being always at position 0, its learned value
    can be its position; with `position=True` the token gets a position embedding `p_cls` of
    its own, `x_cls + p_cls` (the layout of ViT checkpoints, whose position table has a row
    for the token).

    Args:
        initializer: initializer for the token (zeros, as in the original ViT).
        position: bool, add a learned position vector `p_cls` (initialised like the token).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, N, d]` patch (or token) embeddings.
        padding_mask: optional boolean `[B, N]`; when given the layer also returns the mask
            extended by one real position, `[B, N + 1]`.

    Returns:
        `[B, N + 1, d]` in the compute dtype, or `(outputs, padding_mask)` when a mask is
        given.

    Example:
    >>> patches = keras.random.normal((2, 16, 32))
    >>> ClassToken()(patches).shape  # (2, 17, 32)
    """

    def __init__(self, initializer="zeros", position=False, **kwargs):
        super().__init__(**kwargs)
        self.initializer = get_initializer("initializer", initializer)
        if not isinstance(position, bool):
            raise ValueError(f"position must be a bool. Received: position={position!r}")
        self.position = position

    def build(self, inputs_shape, padding_mask_shape=None):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "ClassToken expects inputs of rank 3 [batch, length, dim] with a static dim. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        self.token = self.add_weight(
            name="token", shape=(1, 1, inputs_shape[-1]), initializer=self.initializer
        )
        self.position_embedding = None
        if self.position:
            self.position_embedding = self.add_weight(
                name="position", shape=(1, 1, inputs_shape[-1]),
                initializer=self.initializer.__class__.from_config(self.initializer.get_config()),
            )

    def call(self, inputs, padding_mask=None):
        check_sequence_width(inputs, self.token.shape[-1])
        check_padding_mask(padding_mask, inputs)
        shape = ops.shape(inputs)
        token = ops.cast(self.token, self.compute_dtype)
        if self.position_embedding is not None:
            token = token + ops.cast(self.position_embedding, self.compute_dtype)
        token = ops.broadcast_to(token, (shape[0], 1, shape[2]))
        outputs = ops.concatenate([token, ops.cast(inputs, self.compute_dtype)], axis=1)
        if padding_mask is None:
            return outputs
        padding_mask = ops.cast(padding_mask, "bool")
        first = ops.ones((shape[0], 1), dtype="bool")
        return outputs, ops.concatenate([first, padding_mask], axis=1)

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        length = None if inputs_shape[1] is None else inputs_shape[1] + 1
        outputs = (inputs_shape[0], length, inputs_shape[2])
        if padding_mask_shape is None:
            return outputs
        return outputs, (inputs_shape[0], length)

    def compute_output_spec(self, inputs, padding_mask=None):
        shape = self.compute_output_shape(
            inputs.shape, None if padding_mask is None else padding_mask.shape
        )
        if padding_mask is None:
            return keras.KerasTensor(shape, dtype=self.compute_dtype)
        return (keras.KerasTensor(shape[0], dtype=self.compute_dtype),
                keras.KerasTensor(shape[1], dtype="bool"))

    def get_config(self):
        config = super().get_config()
        config.update({"initializer": keras.initializers.serialize(self.initializer),
                       "position": self.position})
        return config
