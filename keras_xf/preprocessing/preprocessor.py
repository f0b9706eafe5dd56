"""What every task preprocessor shares: its tokenizer, in either slot, and its config."""

import keras
import numpy as np

from keras_xf.ops.checks import check_bool
from keras_xf.preprocessing.hugging_face_tokenizer import HuggingFaceTokenizer
from keras_xf.preprocessing.keras_hub_tokenizer import KerasHubTokenizer
from keras_xf.preprocessing.keras_hub_tokenizer import keras_hub_tokenizer_class
from keras_xf.preprocessing.text_inputs import unpadded_rows

TOKENIZERS = (HuggingFaceTokenizer, KerasHubTokenizer)


def text_tokenizer(tokenizer):
    """A `HuggingFaceTokenizer` or `KerasHubTokenizer` as it is; a keras-hub tokenizer
    wrapped in a `KerasHubTokenizer`; a serialised one deserialised."""
    if isinstance(tokenizer, dict):
        tokenizer = keras.saving.deserialize_keras_object(tokenizer)
    if isinstance(tokenizer, TOKENIZERS):
        return tokenizer
    if type(tokenizer).__module__.startswith("keras_hub") and isinstance(
            tokenizer, keras_hub_tokenizer_class()):
        return KerasHubTokenizer(tokenizer)
    raise ValueError(
        "tokenizer must be a HuggingFaceTokenizer, a KerasHubTokenizer or a "
        "keras_hub.tokenizers.Tokenizer. Received: tokenizer of type "
        f"{type(tokenizer).__name__}"
    )


@keras.saving.register_keras_serializable(package="keras_xf")
class Preprocessor:
    """The base of the task preprocessors: strings in, the model's int32 inputs out, on the
    host (NumPy), before any backend sees them.

    A preprocessor is called as `preprocessor(x, y=None, sample_weight=None)` and returns
    what `fit` takes (`keras.utils.pack_x_y_sample_weight`); `generate_preprocess` and
    `generate_postprocess` turn prompts into ids and generated ids into text. Its config
    holds its tokenizer's config (with the vocabulary), so a task saved in `.keras` reloads
    its preprocessor without the files it came from.

    Args:
        tokenizer: a `HuggingFaceTokenizer`, a `KerasHubTokenizer`, or a keras-hub
            tokenizer (wrapped in a `KerasHubTokenizer`).
        truncate: bool; `False` (the default) raises a `ValueError` for a text longer than
            the sequence length, `True` cuts it.

    Example:
    >>> import keras_hub
    >>> preprocessor = Preprocessor(keras_hub.tokenizers.ByteTokenizer())
    >>> preprocessor.tokenizer.vocabulary_size
    256
    """

    def __init__(self, tokenizer, truncate=False):
        self.tokenizer = text_tokenizer(tokenizer)
        self.truncate = check_bool("truncate", truncate)

    def __call__(self, x, y=None, sample_weight=None):
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def rows_to_text(self, rows, prompts=None):
        """Generated ids (a dict with a mask, an array or lists) to strings: each row cut
        at its first end token past its prompt (`prompts`: the prompts' id lists), its
        padding and special tokens dropped."""
        rows = unpadded_rows(rows)
        end = self.tokenizer.end_token_id
        if end is not None:
            starts = [len(p) for p in prompts] if prompts is not None else [0] * len(rows)
            rows = [row[: start + row[start:].index(end)] if end in row[start:] else row
                    for row, start in zip(rows, starts)]
        return self.tokenizer.detokenize(rows, skip_special_tokens=True)

    def get_config(self):
        return {"tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
                "truncate": self.truncate}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def weighted(sample_weight, mask):
    """Per-token weights: the padding mask (float32) times per-example weights `[B]` when
    given."""
    weights = np.asarray(mask, "float32")
    if sample_weight is None:
        return weights
    sample_weight = np.asarray(sample_weight, "float32")
    if sample_weight.shape != weights.shape[:1]:
        raise ValueError(
            f"sample_weight must hold one weight per text, shape ({weights.shape[0]},). "
            f"Received: sample_weight.shape={sample_weight.shape}"
        )
    return weights * sample_weight[:, None]
