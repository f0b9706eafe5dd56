"""Strings (and integer labels) to the inputs of a text classifier or encoder (keras-hub's
`TextClassifierPreprocessor`)."""

import keras
import numpy as np

from keras_xf.ops.checks import check_bool
from keras_xf.preprocessing.preprocessor import Preprocessor
from keras_xf.preprocessing.text_inputs import check_sequence_length
from keras_xf.preprocessing.text_inputs import text_list


@keras.saving.register_keras_serializable(package="keras_xf")
class TextClassifierPreprocessor(Preprocessor):
    """Texts to `{"token_ids", "padding_mask"}` (int32 `[B, sequence_length]`) with the
    tokenizer's own special tokens (BERT's `[CLS]` and `[SEP]`), and labels to int32 `[B]`:
    the preprocessor of a `TextClassifier` or a `TextEncoder`.

    Args:
        tokenizer: a `HuggingFaceTokenizer`, `KerasHubTokenizer` or keras-hub tokenizer.
        sequence_length: int, the packed width.
        truncate: bool; `False` raises a `ValueError` for a text longer than
            `sequence_length`, `True` cuts it (keeping the special tokens).
        segment_ids: bool; `True` adds int32 `segment_ids` to `x`, all 0 (one segment per
            text), for a backbone built with two or more segments (BERT's).

    Example:
    >>> import keras_hub
    >>> preprocessor = TextClassifierPreprocessor(keras_hub.tokenizers.ByteTokenizer(),
    ...                                           sequence_length=8)
    >>> x, y = preprocessor(["abc", "de"], [0, 1])
    """

    def __init__(self, tokenizer, sequence_length, truncate=False, segment_ids=False):
        super().__init__(tokenizer, truncate=truncate)
        self.sequence_length = check_sequence_length(sequence_length)
        self.segment_ids = check_bool("segment_ids", segment_ids)

    def __call__(self, x, y=None, sample_weight=None):
        """`x` packed; `y` as int32 labels `[B]` when given; `sample_weight` as it is."""
        texts = text_list(x, "x")
        inputs = self.tokenizer.pack(texts, self.sequence_length, truncate=self.truncate)
        if self.segment_ids:
            inputs["segment_ids"] = np.zeros_like(inputs["token_ids"])
        if y is not None:
            y = np.asarray(y)
            if y.shape[:1] != (len(texts),) or y.dtype.kind not in "iu":
                raise ValueError(f"y must hold one integer label per text, shape "
                                 f"({len(texts)},). Received: y.shape={y.shape}, "
                                 f"y.dtype={y.dtype}")
            y = y.astype("int32")
        return keras.utils.pack_x_y_sample_weight(inputs, y, sample_weight)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length,
                "segment_ids": self.segment_ids}
