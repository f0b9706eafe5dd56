"""Source and target strings to the inputs, labels and weights of an encoder-decoder model
(keras-hub's `Seq2SeqLMPreprocessor`)."""

import keras

from keras_xf.ops.checks import check_positive_int
from keras_xf.preprocessing.preprocessor import Preprocessor
from keras_xf.preprocessing.preprocessor import weighted
from keras_xf.preprocessing.text_inputs import check_lengths
from keras_xf.preprocessing.text_inputs import check_sequence_length
from keras_xf.preprocessing.text_inputs import fit_rows
from keras_xf.preprocessing.text_inputs import pack_rows
from keras_xf.preprocessing.text_inputs import text_list

KEYS = ("encoder_text", "decoder_text")


@keras.saving.register_keras_serializable(package="keras_xf")
class Seq2SeqLMPreprocessor(Preprocessor):
    """`{"encoder_text", "decoder_text"}` to `(x, y, sample_weight)` for `Seq2SeqLM.fit`,
    sources to ids for `generate`, and generated ids back to text.

    Sources are tokenized with the tokenizer's special tokens (T5's `</s>`) and packed to
    `encoder_sequence_length`; targets become `[decoder_start] + ids + [end]` packed to
    `decoder_sequence_length + 1`, the decoder inputs all but the last position, the labels
    the ids shifted left, the weights 0 on padding.

    Args:
        tokenizer: a `HuggingFaceTokenizer`, `KerasHubTokenizer` or keras-hub tokenizer.
        encoder_sequence_length: int, the packed width of the sources.
        decoder_sequence_length: int, the packed width of the targets and the default
            output length of `generate`.
        decoder_start_token_id: optional int, the first decoder token (the model's
            `start_token_id`); by default the tokenizer's start token, else its pad token.
        truncate: bool; `False` raises a `ValueError` for a text longer than its length.

    Example:
    >>> import keras_hub
    >>> preprocessor = Seq2SeqLMPreprocessor(keras_hub.tokenizers.ByteTokenizer(),
    ...                                      encoder_sequence_length=8,
    ...                                      decoder_sequence_length=8)
    >>> x, y, sample_weight = preprocessor({"encoder_text": ["abc"], "decoder_text": ["de"]})
    >>> preprocessor.generate_preprocess(["abc"])
    [[97, 98, 99]]
    """

    def __init__(self, tokenizer, encoder_sequence_length, decoder_sequence_length,
                 decoder_start_token_id=None, truncate=False):
        super().__init__(tokenizer, truncate=truncate)
        self.encoder_sequence_length = check_sequence_length(
            encoder_sequence_length, "encoder_sequence_length")
        self.decoder_sequence_length = check_sequence_length(
            decoder_sequence_length, "decoder_sequence_length")
        if decoder_start_token_id is None:
            start = self.tokenizer.start_token_id
            decoder_start_token_id = start if start is not None else self.tokenizer.pad_token_id
        self.decoder_start_token_id = check_positive_int(
            "decoder_start_token_id", decoder_start_token_id, minimum=0)

    def _sources(self, texts, name):
        length = self.encoder_sequence_length if self.truncate else None
        rows = self.tokenizer.tokenize(text_list(texts, name), add_special_tokens=True,
                                       sequence_length=length, truncate=self.truncate)
        check_lengths(rows, self.encoder_sequence_length, "encoder_sequence_length")
        return rows

    def __call__(self, x, y=None, sample_weight=None):
        """`(x, y, sample_weight)` for `fit` from `x = {"encoder_text", "decoder_text"}`;
        the labels come from the targets, so `y` must be `None`."""
        if not isinstance(x, dict) or sorted(x) != sorted(KEYS):
            raise ValueError(f"x must be a dict with keys {list(KEYS)}. Received: x of type "
                             f"{type(x).__name__}")
        if y is not None:
            raise ValueError("A seq2seq LM's labels are its decoder texts shifted by one: pass "
                             f"x alone. Received: y of type {type(y).__name__}")
        sources = pack_rows(self._sources(x["encoder_text"], "encoder_text"),
                            self.encoder_sequence_length, self.tokenizer.pad_token_id)
        end = [self.tokenizer.end_token_id] if self.tokenizer.end_token_id is not None else []
        targets = [[self.decoder_start_token_id] + row + end for row in self.tokenizer.tokenize(
            text_list(x["decoder_text"], "decoder_text"), add_special_tokens=False)]
        width = self.decoder_sequence_length + 1
        targets = pack_rows(fit_rows(targets, width, self.truncate, keep_last=len(end),
                                     name="decoder_sequence_length",
                                     received=self.decoder_sequence_length),
                            width, self.tokenizer.pad_token_id)
        ids, mask = targets["token_ids"], targets["padding_mask"]
        inputs = {"encoder_token_ids": sources["token_ids"],
                  "encoder_padding_mask": sources["padding_mask"],
                  "decoder_token_ids": ids[:, :-1], "decoder_padding_mask": mask[:, :-1]}
        return inputs, ids[:, 1:], weighted(sample_weight, mask[:, 1:])

    @property
    def generation_length(self):
        """The default output length of `generate` on text: `decoder_sequence_length`."""
        return self.decoder_sequence_length

    def generate_preprocess(self, texts):
        """Sources to ragged id lists, each no longer than `encoder_sequence_length`."""
        return self._sources(texts, "texts")

    def generate_postprocess(self, outputs, prompts=None):
        """Generated decoder ids to texts: each cut at its first end token, without the
        start token, padding or special tokens. `prompts` (the sources, which the outputs
        do not repeat) is taken for the call's symmetry with `CausalLMPreprocessor`."""
        return self.rows_to_text(outputs)

    def get_config(self):
        return {**super().get_config(),
                "encoder_sequence_length": self.encoder_sequence_length,
                "decoder_sequence_length": self.decoder_sequence_length,
                "decoder_start_token_id": self.decoder_start_token_id}
