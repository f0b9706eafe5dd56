"""Token embedding plus absolute positions: `e_j = x_j + PE(j)` (survey §2.2)."""

import keras

from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_initializer

POSITIONS = ("sinusoidal", "learned", "rotary", "none")


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """The input layer of a Transformer: token lookup, position, dropout.

    `e_j = x_j · (√d if scale) + PE(j)` with sinusoidal or learned `PE`; with
    `position="rotary"` or `"none"` no absolute position is added (rotary positions act
    inside attention). `reverse=True` projects hidden states back to vocabulary logits
    through the (tied or untied) token embedding.

    Args:
        vocabulary_size, embedding_dim: ints.
        position: `"sinusoidal"`, `"learned"`, `"rotary"` or `"none"`.
        max_sequence_length: int, rows of a learned table (and the longest input).
        tie_weights: bool, tie the reverse projection to the embedding matrix.
        scale: bool, multiply token embeddings by `√d`.
        dropout: float in [0, 1), dropout on the sum.
        embeddings_initializer: initializer of the token matrix.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: int `[B, T]` token ids (or `[B, T, d]` hidden states with `reverse=True`).
        start_index: position of the first token (cached decoding).
        reverse: bool.
        training: bool.

    Returns:
        `[B, T, d]` embeddings, or `[B, T, vocabulary_size]` logits when `reverse=True`.

    Example:
    >>> embed = TokenAndPositionEmbedding(100, 16, position="learned", max_sequence_length=32)
    >>> x = embed(np.array([[1, 2, 3]]))  # (1, 3, 16)
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        position="sinusoidal",
        max_sequence_length=512,
        tie_weights=True,
        scale=False,
        dropout=0.0,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}. Received: position={position!r}")
        check_rate("dropout", dropout)
        check_positive_int("max_sequence_length", max_sequence_length)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.position = position
        self.max_sequence_length = max_sequence_length
        self.tie_weights = tie_weights
        self.scale = scale
        self.dropout = dropout
        self.embeddings_initializer = get_initializer(
            "embeddings_initializer", embeddings_initializer
        )
        self.token_embedding = TokenEmbedding(
            vocabulary_size,
            embedding_dim,
            tie_weights=tie_weights,
            scale=scale,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.position_embedding = None
        if position == "sinusoidal":
            self.position_embedding = SinusoidalPositionEncoding(
                dtype=self.dtype_policy, name="position_embedding"
            )
        elif position == "learned":
            self.position_embedding = LearnedPositionEmbedding(
                max_sequence_length, dtype=self.dtype_policy, name="position_embedding"
            )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.token_embedding.build(inputs_shape)
        if self.position_embedding is not None:
            self.position_embedding.build(tuple(inputs_shape) + (self.embedding_dim,))

    def call(self, inputs, start_index=0, reverse=False, training=None):
        if reverse:
            return self.token_embedding(inputs, reverse=True)
        outputs = self.token_embedding(inputs)
        if self.position_embedding is not None:
            outputs = outputs + self.position_embedding(outputs, start_index=start_index)
        return self.dropout_layer(outputs, training=training)

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)
        return tuple(inputs_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, start_index=0, reverse=False, training=None):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "position": self.position,
                "max_sequence_length": self.max_sequence_length,
                "tie_weights": self.tie_weights,
                "scale": self.scale,
                "dropout": self.dropout,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
