"""The preprocessor a task loaded from a folder carries: built from the folder's tokenizer
(`tokenizer.json`, its special tokens and chat template)."""

import os

from keras_xf.preprocessing import CausalLMPreprocessor
from keras_xf.preprocessing import HuggingFaceTokenizer
from keras_xf.preprocessing import Seq2SeqLMPreprocessor
from keras_xf.preprocessing import TextClassifierPreprocessor

# The packed length when the model's positions do not bound it (rotary, relative, none):
# keras-hub's default.
DEFAULT_SEQUENCE_LENGTH = 1024


def folder_preprocessor(model, directory, max_length=None, truncate=False, lowercase=False):
    """The preprocessor of `model`'s kind (`model.preprocessor_class`) over the folder's
    tokenizer, packing to the model's `max_sequence_length` (at most 1024, and at most
    `max_length`, a folder's own limit such as sentence-transformers' `max_seq_length`);
    `truncate`: texts longer than that are cut to it, as the folder's own library does;
    `lowercase`: texts are lowercased first (sentence-transformers' `do_lower_case`).
    `None` when the folder has no `tokenizer.json` or the model takes no preprocessor."""
    if model.preprocessor_class is None or not os.path.isfile(
            os.path.join(directory, "tokenizer.json")):
        return None
    return task_preprocessor(model, HuggingFaceTokenizer(directory, lowercase=lowercase),
                             max_length=max_length, truncate=truncate)


def task_preprocessor(model, tokenizer, max_length=None, truncate=False):
    """The preprocessor of `model`'s kind over `tokenizer` (see `folder_preprocessor`), or
    `None` when the model takes none."""
    kind = model.preprocessor_class
    if kind is None:
        return None
    bound = model.backbone.max_sequence_length if model.backbone is not None else None
    length = min(bound or DEFAULT_SEQUENCE_LENGTH, max_length or DEFAULT_SEQUENCE_LENGTH,
                 DEFAULT_SEQUENCE_LENGTH)
    if issubclass(kind, Seq2SeqLMPreprocessor):
        return kind(tokenizer, encoder_sequence_length=length, decoder_sequence_length=length,
                    decoder_start_token_id=model.start_token_id)
    if issubclass(kind, TextClassifierPreprocessor):
        return kind(tokenizer, sequence_length=length, truncate=truncate,
                    segment_ids=model.backbone.uses_segment_ids)
    if issubclass(kind, CausalLMPreprocessor):
        return kind(tokenizer, sequence_length=length)
    return None
