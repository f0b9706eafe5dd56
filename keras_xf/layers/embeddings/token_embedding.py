"""Token embedding with an optional √d scale and a tied reverse projection (survey §2.1, §5.4)."""

import math

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer


_FEW_ROWS = 64  # below this many rows the output projection multiplies the table first


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenEmbedding(keras.layers.Layer):
    """Looks up token vectors `x_j = E[token_j]`, and projects back to vocabulary logits.

    The forward call returns `E[ids] · (√d if scale else 1)`. Called with `reverse=True` on
    hidden states `h` it returns logits `h · Eᵀ` (tied input/output embeddings, survey §5.4),
    or `h · W_out` with a separate output matrix when `tie_weights=False`.

    Args:
        vocabulary_size: int, number of tokens.
        embedding_dim: int, width `d`.
        tie_weights: bool, reuse the embedding matrix for the reverse projection.
        scale: bool, multiply embeddings by `√d` as in the original Transformer (and Gemma);
            `√d` is cast to the compute dtype first.
        embeddings_initializer: initializer for the matrix.
        **kwargs: base `Layer` arguments (`name`, `dtype`, …).

    Call arguments:
        inputs: int tensor `[B, T]`, or float `[B, T, d]` when `reverse=True`.
        reverse: bool.

    Returns:
        `[B, T, d]` embeddings, or `[B, T, vocabulary_size]` logits when `reverse=True`.

    Example:
    >>> emb = TokenEmbedding(100, 16)
    >>> logits = emb(emb(np.array([[1, 2, 3]])), reverse=True)  # (1, 3, 100)
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        tie_weights=True,
        scale=False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.tie_weights = tie_weights
        self.scale = scale
        self.embeddings_initializer = get_initializer(
            "embeddings_initializer", embeddings_initializer
        )

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.embedding_dim),
            initializer=self.embeddings_initializer,
        )
        if not self.tie_weights:
            self.reverse_embeddings = self.add_weight(
                name="reverse_embeddings",
                shape=(self.embedding_dim, self.vocabulary_size),
                initializer=clone_initializer(self.embeddings_initializer),
            )

    def call(self, inputs, reverse=False):
        if reverse:
            check_width(inputs, self.embedding_dim)
            if not self.tie_weights:
                return ops.matmul(inputs, ops.cast(self.reverse_embeddings, self.compute_dtype))
            table = ops.cast(self.embeddings, self.compute_dtype)
            # Only for concrete sizes: symbolic ones (shape-polymorphic export, torch.export)
            # would turn the comparison into a guard on the exported input shapes.
            leading = tuple(inputs.shape[:-1])
            rows = math.prod(leading) if all(type(d) is int for d in leading) else None
            if rows is not None and rows <= _FEW_ROWS:
                # A few rows (a decoding step): `table · hᵀ` reads the table in its own
                # layout, where `h · tableᵀ` makes XLA copy the whole table transposed.
                flat = ops.reshape(inputs, (rows, inputs.shape[-1]))
                logits = ops.transpose(ops.matmul(table, ops.transpose(flat)))
                return ops.reshape(logits, tuple(inputs.shape[:-1]) + (self.vocabulary_size,))
            return ops.matmul(inputs, ops.transpose(table))
        outputs = ops.take(ops.cast(self.embeddings, self.compute_dtype), ops.cast(inputs, "int32"), axis=0)
        if self.scale:
            outputs = outputs * ops.cast(self.embedding_dim**0.5, outputs.dtype)
        return outputs

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)
        return tuple(inputs_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "tie_weights": self.tie_weights,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
