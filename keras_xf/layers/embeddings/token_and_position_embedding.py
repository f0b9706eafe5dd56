"""Token embedding plus absolute positions: `e_j = x_j + PE(j)` (survey §2.2)."""

import keras
from keras import ops

from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.layers.residual.residual import NORMALIZATIONS
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.checks import static_dim

POSITIONS = ("sinusoidal", "learned", "rotary", "none")


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """The input layer of a Transformer: token lookup, position, segment, norm, dropout.

    `e_j = Norm(x_j · (√d if scale) + PE(j + position_offset) + S[s_j])` with sinusoidal or
    learned `PE` (survey §2.2), optional segment (token-type) embeddings `S` of BERT's
    sentence pairs, and an optional normalisation of the sum (BERT's embedding LayerNorm);
    dropout follows. With `position="rotary"` or `"none"` no absolute position is added
    (rotary positions act inside attention). `reverse=True` projects hidden states back to
    vocabulary logits through the (tied or untied) token embedding.

    Args:
        vocabulary_size, embedding_dim: ints.
        position: `"sinusoidal"`, `"learned"`, `"rotary"` or `"none"`.
        max_sequence_length: int, rows of a learned table (with `position_offset`, the
            longest input is `max_sequence_length - position_offset`).
        tie_weights: bool, tie the reverse projection to the embedding matrix.
        scale: bool, multiply token embeddings by `√d`.
        dropout: float in [0, 1), dropout on the (normalised) sum.
        embeddings_initializer: initializer of the token (and segment) matrix.
        num_segments: optional int, rows of the segment table `S`; `None` adds no segment
            embedding.
        normalization: `None`, `"layer_norm"` or `"rms_norm"` applied to the sum.
        epsilon: float > 0, the epsilon of that normalisation.
        position_offset: int >= 0, the position of the first token: token `j` takes position
            `j + position_offset` (RoBERTa's learned positions start at row 2).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: int `[B, T]` token ids (or `[B, T, d]` hidden states with `reverse=True`).
        start_index: position of the first token (cached decoding), before the offset.
        reverse: bool.
        training: bool.
        segment_ids: optional int `[B, T]` in `[0, num_segments)`; `None` means segment 0
            everywhere. Only with `num_segments`.

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
        num_segments=None,
        normalization=None,
        epsilon=1e-5,
        position_offset=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}. Received: position={position!r}")
        check_rate("dropout", dropout)
        check_positive_int("max_sequence_length", max_sequence_length)
        _check_options(position, max_sequence_length, num_segments, normalization, epsilon,
                       position_offset)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.position = position
        self.max_sequence_length = max_sequence_length
        self.tie_weights = tie_weights
        self.scale = scale
        self.dropout = dropout
        self.num_segments = num_segments
        self.normalization = normalization
        self.epsilon = epsilon
        self.position_offset = int(position_offset)
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
        self.segment_embedding = None
        if num_segments is not None:
            self.segment_embedding = keras.layers.Embedding(
                num_segments, embedding_dim, embeddings_initializer=self.embeddings_initializer,
                dtype=self.dtype_policy, name="segment_embedding",
            )
        self.norm = None
        if normalization is not None:
            self.norm = make_normalization(normalization, epsilon, self.dtype_policy, "norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.token_embedding.build(inputs_shape)
        outputs_shape = tuple(inputs_shape) + (self.embedding_dim,)
        if self.position_embedding is not None:
            self.position_embedding.build(outputs_shape)
            self._check_length(inputs_shape, 0)
        if self.segment_embedding is not None:
            self.segment_embedding.build(inputs_shape)
        if self.norm is not None:
            self.norm.build(outputs_shape)

    def call(self, inputs, start_index=0, reverse=False, training=None, segment_ids=None):
        if reverse:
            return self.token_embedding(inputs, reverse=True)
        outputs = self.token_embedding(inputs)
        if self.position_embedding is not None:
            self._check_length(inputs.shape, start_index)
            outputs = outputs + self.position_embedding(
                outputs, start_index=start_index + self.position_offset
            )
        if self.segment_embedding is not None:
            if segment_ids is None:
                # Called, not read from `.embeddings`: an int8 table needs its scale.
                segments = ops.cast(self.segment_embedding(ops.zeros((1,), "int32"))[0],
                                    outputs.dtype)
            else:
                check_padding_mask(segment_ids, inputs, "segment_ids", "inputs")
                segments = self.segment_embedding(ops.cast(segment_ids, "int32"))
            outputs = outputs + segments
        elif segment_ids is not None:
            raise ValueError("segment_ids needs a segment table (num_segments). Received: "
                             "segment_ids with num_segments=None")
        if self.norm is not None:
            outputs = self.norm(outputs)
        return self.dropout_layer(outputs, training=training)

    def _check_length(self, inputs_shape, start_index):
        """A learned table has a row for every position, the offset's included."""
        if self.position != "learned" or len(inputs_shape) < 2:
            return
        length = static_dim(inputs_shape[1])
        if length is None or not isinstance(start_index, int):
            return
        last = start_index + self.position_offset + length - 1
        if last >= self.max_sequence_length:
            raise ValueError(
                "The input is longer than the position table: positions up to "
                f"{last} with max_sequence_length={self.max_sequence_length}. Received: "
                f"length {length}, start_index={start_index}, "
                f"position_offset={self.position_offset}"
            )

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)
        return tuple(inputs_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, start_index=0, reverse=False, training=None,
                            segment_ids=None):
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
                "num_segments": self.num_segments,
                "normalization": self.normalization,
                "epsilon": self.epsilon,
                "position_offset": self.position_offset,
            }
        )
        return config


def _check_options(position, max_sequence_length, num_segments, normalization, epsilon,
                   position_offset):
    if num_segments is not None:
        check_positive_int("num_segments", num_segments)
    if normalization is not None and normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be None or one of {NORMALIZATIONS}. Received: "
                         f"normalization={normalization!r}")
    check_positive_number("epsilon", epsilon)
    check_positive_int("position_offset", position_offset, minimum=0)
    if position_offset and position not in ("sinusoidal", "learned"):
        raise ValueError(
            "position_offset shifts absolute positions (position='sinusoidal' or 'learned'). "
            f"Received: position_offset={position_offset}, position={position!r}"
        )
    if position == "learned" and position_offset >= max_sequence_length:
        raise ValueError(
            "position_offset must be below max_sequence_length, the rows of the position "
            f"table. Received: position_offset={position_offset}, "
            f"max_sequence_length={max_sequence_length}"
        )

