"""Strings to the inputs, labels and weights of a causal language model (keras-hub's
`CausalLMPreprocessor`)."""

import keras

from keras_xf.preprocessing.preprocessor import Preprocessor
from keras_xf.preprocessing.preprocessor import weighted
from keras_xf.preprocessing.text_inputs import check_sequence_length
from keras_xf.preprocessing.text_inputs import fit_rows
from keras_xf.preprocessing.text_inputs import pack_rows
from keras_xf.preprocessing.text_inputs import text_list


def _flag(name, value, token_id, default):
    """`add_start_token` / `add_end_token`: `None` gives `default`; `True` needs the id."""
    if value is None:
        return default and token_id is not None
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be None or a bool. Received: {name}={value!r}")
    if value and token_id is None:
        raise ValueError(f"{name}=True needs a tokenizer with that special token; this one "
                         f"has none. Received: {name}=True")
    return value


@keras.saving.register_keras_serializable(package="keras_xf")
class CausalLMPreprocessor(Preprocessor):
    """Texts to `(x, y, sample_weight)` for `CausalLM.fit`, prompts to ids for `generate`
    and generated ids back to text.

    For `fit`, each text becomes `[start] + ids + [end]` packed to `sequence_length + 1`;
    `x` is `{"token_ids", "padding_mask"}` (int32 `[B, sequence_length]`) of all but the
    last position, `y` the ids shifted left by one, and `sample_weight` 1 on real tokens
    and 0 on padding (times per-text weights when given).

    Args:
        tokenizer: a `HuggingFaceTokenizer`, `KerasHubTokenizer` or keras-hub tokenizer.
        sequence_length: int, the packed width of `x` and the default output length of
            `generate`.
        add_start_token: bool, or `None` (default): as the tokenizer does itself (a
            Llama folder adds `<s>`, GPT-2 adds nothing). Never added to a text that
            starts with it already (a chat template that writes `bos_token`).
        add_end_token: bool, or `None` (default): add it when the tokenizer has one. Never
            added to prompts.
        truncate: bool; `False` raises a `ValueError` for a text longer than
            `sequence_length`, `True` cuts it.

    Example:
    >>> import keras_hub
    >>> preprocessor = CausalLMPreprocessor(keras_hub.tokenizers.ByteTokenizer(),
    ...                                     sequence_length=8)
    >>> x, y, sample_weight = preprocessor(["abc"])
    >>> preprocessor.generate_preprocess(["ab"])
    [[97, 98]]
    >>> preprocessor.generate_postprocess([[97, 98, 99]])
    ['abc']
    """

    def __init__(self, tokenizer, sequence_length, add_start_token=None, add_end_token=None,
                 truncate=False):
        super().__init__(tokenizer, truncate=truncate)
        self.sequence_length = check_sequence_length(sequence_length)
        self.add_start_token = _flag("add_start_token", add_start_token,
                                     self.tokenizer.start_token_id,
                                     self.tokenizer.adds_start_token)
        self.add_end_token = _flag("add_end_token", add_end_token,
                                   self.tokenizer.end_token_id, True)

    def _rows(self, texts, end, length):
        start = [self.tokenizer.start_token_id] if self.add_start_token else []
        stop = [self.tokenizer.end_token_id] if end and self.add_end_token else []
        rows = self.tokenizer.tokenize(text_list(texts, "x"), add_special_tokens=False)
        # A text that already starts with the start token (a rendered chat template that
        # writes `bos_token`) does not get a second one.
        rows = [(start if row[:1] != start else []) + row + stop for row in rows]
        return fit_rows(rows, length, self.truncate, keep_last=len(stop),
                        received=self.sequence_length)

    def __call__(self, x, y=None, sample_weight=None):
        """`(x, y, sample_weight)` of texts `x` for `fit`; the labels come from the texts,
        so `y` must be `None`."""
        if y is not None:
            raise ValueError("A causal LM's labels are its texts shifted by one: pass texts "
                             f"alone. Received: y of type {type(y).__name__}")
        packed = pack_rows(self._rows(x, True, self.sequence_length + 1),
                           self.sequence_length + 1, self.tokenizer.pad_token_id)
        ids, mask = packed["token_ids"], packed["padding_mask"]
        inputs = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
        return inputs, ids[:, 1:], weighted(sample_weight, mask[:, 1:])

    @property
    def generation_length(self):
        """The default output length of `generate` on text: `sequence_length`."""
        return self.sequence_length

    def generate_preprocess(self, texts):
        """Prompts to ragged id lists (start token as configured, no end token), each no
        longer than `sequence_length`."""
        return self._rows(texts, False, self.sequence_length)

    def generate_postprocess(self, outputs, prompts=None):
        """Generated ids (what `generate` returns for id lists, or a dict with a mask) to
        texts: each cut at its first end token past its prompt (`prompts`, the lists of
        `generate_preprocess`), without padding or special tokens."""
        return self.rows_to_text(outputs, prompts)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length,
                "add_start_token": self.add_start_token, "add_end_token": self.add_end_token}
