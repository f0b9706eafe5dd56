"""The tokenizer files that `to_huggingface` writes beside a model whose preprocessor holds a
`HuggingFaceTokenizer`, as `transformers`' `save_pretrained` writes them."""

import json
import os

from keras_xf.preprocessing import HuggingFaceTokenizer

# The tokenizer class a written `tokenizer_config.json` names: the fast tokenizer over
# `tokenizer.json`, which `transformers` 4 and 5 both load.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def model_tokenizer(model):
    """The `HuggingFaceTokenizer` of `model`'s preprocessor, or `None` (no preprocessor, or a
    keras-hub tokenizer, which has no `tokenizer.json` to write)."""
    preprocessor = model.preprocessor
    if preprocessor is None or not isinstance(preprocessor.tokenizer, HuggingFaceTokenizer):
        return None
    return preprocessor.tokenizer


def write_tokenizer_files(tokenizer, directory):
    """Writes `tokenizer` into `directory` as `transformers` 5 saves a fast tokenizer:
    `tokenizer.json`, `tokenizer_config.json` (the tokenizer class and the special tokens)
    and, when the tokenizer has one, `chat_template.jinja`.

    The `tokenizer.json` is the tokenizer as keras_xf holds it, with no padding or
    truncation saved in it (`HuggingFaceTokenizer` switches a folder's off when it reads
    it): `transformers` pads and truncates when a call asks, and a reader that honours the
    saved settings (the `tokenizers` library alone) gets ragged ids, not rows padded to a
    length it never asked for.

    Args:
        tokenizer: a `HuggingFaceTokenizer`.
        directory: an existing folder.

    Returns:
        The names of the files written, in order.

    Example:
    >>> tokenizer = HuggingFaceTokenizer("path/to/llama")  # doctest: +SKIP
    >>> write_tokenizer_files(tokenizer, "path/to/out")  # doctest: +SKIP
    ['tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja']
    """
    if not isinstance(tokenizer, HuggingFaceTokenizer):
        raise ValueError("tokenizer must be a HuggingFaceTokenizer. Received: tokenizer of "
                         f"type {type(tokenizer).__name__}")
    files = {"tokenizer.json": tokenizer.tokenizer_json,
             "tokenizer_config.json": json.dumps(
                 {"tokenizer_class": TOKENIZER_CLASS, **tokenizer.special_tokens},
                 indent=2, ensure_ascii=False)}
    if tokenizer.chat_template is not None:
        files["chat_template.jinja"] = tokenizer.chat_template
    for name, text in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
            file.write(text)
    return list(files)
