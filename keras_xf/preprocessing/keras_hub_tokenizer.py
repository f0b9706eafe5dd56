"""A keras-hub tokenizer (byte, byte-pair, SentencePiece, or a model's) in the slot of a
keras_xf tokenizer: id lists and strings out, never tensors."""

import base64
import os
import tempfile

import keras
import numpy as np

from keras_xf.preprocessing.text_inputs import check_sequence_length
from keras_xf.preprocessing.text_inputs import fit_rows
from keras_xf.preprocessing.text_inputs import is_single_row
from keras_xf.preprocessing.text_inputs import pack_rows
from keras_xf.preprocessing.text_inputs import text_list
from keras_xf.preprocessing.text_inputs import unpadded_rows


def keras_hub_tokenizer_class():
    """keras-hub's tokenizer base class (imported when first needed: keras-hub takes
    seconds to import)."""
    try:
        import keras_hub
    except ImportError:
        raise ImportError("keras-hub tokenizers need keras-hub: "
                          "pip install 'keras-xf[hub]'") from None
    return keras_hub.tokenizers.Tokenizer


def keeps_assets(tokenizer):
    """Whether a keras-hub tokenizer keeps its vocabulary in files (`save_assets`) rather
    than its config: the byte-pair, SentencePiece and WordPiece tokenizers."""
    import keras_hub

    kinds = (keras_hub.tokenizers.BytePairTokenizer, keras_hub.tokenizers.SentencePieceTokenizer,
             keras_hub.tokenizers.WordPieceTokenizer)
    return isinstance(tokenizer, kinds)


def _plain(value):
    """A keras-hub output (a list, an array, or a TensorFlow tensor, ragged or not) as
    Python lists, strings and ints."""
    if isinstance(value, (list, str, int)):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    import tensorflow as tf

    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    return np.asarray(value).tolist()


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _model_token_id(tokenizer, name):
    # keras-hub declares start, end and pad ids on its model tokenizers only (GPT2Tokenizer,
    # ...); its own preprocessors read them the same way.
    value = vars(tokenizer).get(name)
    return int(value) if isinstance(value, (int, np.integer)) else None


@keras.saving.register_keras_serializable(package="keras_xf")
class KerasHubTokenizer:
    """A keras-hub tokenizer with the calls of `HuggingFaceTokenizer`: `tokenize` returns
    ragged id lists, `pack` int32 `{"token_ids", "padding_mask"}`, `detokenize` strings.

    keras-hub tokenizers add no special tokens themselves: with `add_special_tokens=True`,
    `tokenize` puts `start_token_id` before a text and `end_token_id` after it, where the
    tokenizer has them. Truncation happens only with `truncate=True`.

    The config holds the keras-hub tokenizer's config and the files its `save_assets`
    writes (vocabulary, merges, SentencePiece proto), so a saved model reloads it whole.

    Args:
        tokenizer: a `keras_hub.tokenizers.Tokenizer` (or its serialised config).
        start_token_id, end_token_id, pad_token_id: optional ints; by default those a
            keras-hub model tokenizer declares (`GPT2Tokenizer`: `<|endoftext|>`), else
            none (pad: 0).
        assets: the files of a saved tokenizer, base64 (set by `from_config`).

    Example:
    >>> import keras_hub
    >>> tokenizer = KerasHubTokenizer(keras_hub.tokenizers.ByteTokenizer())
    >>> tokenizer(["abc", "de"])
    [[97, 98, 99], [100, 101]]
    >>> tokenizer.detokenize([[97, 98, 99]])
    ['abc']
    """

    def __init__(self, tokenizer, start_token_id=None, end_token_id=None, pad_token_id=None,
                 assets=None):
        if isinstance(tokenizer, dict):
            tokenizer = keras.saving.deserialize_keras_object(tokenizer)
        if not isinstance(tokenizer, keras_hub_tokenizer_class()):
            raise ValueError(
                "tokenizer must be a keras_hub.tokenizers.Tokenizer. Received: tokenizer of "
                f"type {type(tokenizer).__name__}"
            )
        if assets:
            with tempfile.TemporaryDirectory() as directory:
                for name, content in assets.items():
                    with open(os.path.join(directory, name), "wb") as file:
                        file.write(base64.b64decode(content))
                tokenizer.load_assets(directory)
        self.tokenizer = tokenizer
        self.start_token_id = (start_token_id if start_token_id is not None
                               else _model_token_id(tokenizer, "start_token_id"))
        self.end_token_id = (end_token_id if end_token_id is not None
                             else _model_token_id(tokenizer, "end_token_id"))
        self.pad_token_id = (pad_token_id if pad_token_id is not None
                             else _model_token_id(tokenizer, "pad_token_id") or 0)
        # keras-hub's preprocessors start every text with the start token where the
        # tokenizer has one (its tokenizers never add it themselves).
        self.adds_start_token = self.start_token_id is not None

    @property
    def vocabulary_size(self):
        return int(self.tokenizer.vocabulary_size())

    def token_to_id(self, token):
        return int(self.tokenizer.token_to_id(token))

    def id_to_token(self, token_id):
        return _text(self.tokenizer.id_to_token(int(token_id)))

    @property
    def special_token_ids(self):
        """The sorted start and end ids and those keras-hub declares special."""
        ids = {int(i) for i in self.tokenizer.special_token_ids}
        ids |= {self.start_token_id, self.end_token_id}
        return sorted(i for i in ids if i is not None)

    def tokenize(self, texts, add_special_tokens=True, sequence_length=None, truncate=False):
        """A string to its ids, or a list of strings to a list of id lists; see
        `HuggingFaceTokenizer.tokenize` (the start and end ids are the special tokens)."""
        single = isinstance(texts, (str, bytes))
        rows = [list(map(int, row)) for row in _plain(self.tokenizer(text_list(texts)))]
        if truncate and sequence_length is None:
            raise ValueError("truncate=True needs the length to cut to: sequence_length. "
                             "Received: sequence_length=None")
        ends = (self.start_token_id, self.end_token_id) if add_special_tokens else (None, None)
        start, end = ([] if i is None else [i] for i in ends)
        if sequence_length is not None:
            room = check_sequence_length(sequence_length) - len(start) - len(end)
            if truncate and room < 0:
                raise ValueError(f"sequence_length leaves no room for the special tokens. "
                                 f"Received: sequence_length={sequence_length}")
            rows = fit_rows(rows, room, truncate, name="sequence_length") if truncate else rows
        rows = [start + row + end for row in rows]
        if sequence_length is not None:
            rows = fit_rows(rows, sequence_length, truncate=False)
        return rows[0] if single else rows

    __call__ = tokenize

    def pack(self, texts, sequence_length, add_special_tokens=True, truncate=False):
        """Texts as int32 `{"token_ids", "padding_mask"}` `[B, sequence_length]`."""
        rows = self.tokenize(text_list(texts), add_special_tokens=add_special_tokens,
                             sequence_length=check_sequence_length(sequence_length),
                             truncate=truncate)
        return pack_rows(rows, sequence_length, self.pad_token_id)

    def detokenize(self, ids, skip_special_tokens=True):
        """Ids (a list, a list of lists, an array, or a dict of ids and mask) to a string
        or a list of strings; the start, end and pad ids dropped with
        `skip_special_tokens`."""
        rows = unpadded_rows(ids)
        if skip_special_tokens:
            special = set(self.special_token_ids) | {self.pad_token_id}
            rows = [[i for i in row if i not in special] for row in rows]
        texts = [_text(_plain(self.tokenizer.detokenize(np.asarray([row], "int32")))[0])
                 if row else "" for row in rows]
        return texts[0] if is_single_row(ids) else texts

    def get_config(self):
        assets = {}
        with tempfile.TemporaryDirectory() as directory:
            if keeps_assets(self.tokenizer):
                self.tokenizer.save_assets(directory)
            for name in sorted(os.listdir(directory)):
                with open(os.path.join(directory, name), "rb") as file:
                    assets[name] = base64.b64encode(file.read()).decode("ascii")
        return {"tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
                "start_token_id": self.start_token_id, "end_token_id": self.end_token_id,
                "pad_token_id": self.pad_token_id, "assets": assets}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
