"""The tokenizer files that `to_huggingface` writes beside a model whose preprocessor holds a
`HuggingFaceTokenizer`, as `transformers`' `save_pretrained` writes them."""

import json
import os

from keras_xf.ops.checks import check_positive_int
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


def write_tokenizer_files(tokenizer, directory, model_max_length=None):
    """Writes `tokenizer` into `directory` as `transformers` 5 saves a fast tokenizer:
    `tokenizer.json`, `tokenizer_config.json` (the tokenizer class, the special tokens and
    the longest input, `model_max_length`, when given) and, when the tokenizer has one,
    `chat_template.jinja`.

    The `tokenizer.json` is the tokenizer as keras_xf holds it, with no padding or
    truncation saved in it (`HuggingFaceTokenizer` switches a folder's off when it reads
    it): `transformers` pads and truncates when a call asks, and a reader that honours the
    saved settings (the `tokenizers` library alone) gets ragged ids, not rows padded to a
    length it never asked for.

    Args:
        tokenizer: a `HuggingFaceTokenizer`.
        directory: an existing folder.
        model_max_length: optional int, the most tokens the model takes (its learned
            positions), which `transformers` truncates to when asked.

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
    config = {"tokenizer_class": TOKENIZER_CLASS, **tokenizer.special_tokens}
    if model_max_length is not None:
        config["model_max_length"] = check_positive_int("model_max_length", model_max_length)
    files = {"tokenizer.json": tokenizer.tokenizer_json,
             "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}
    if tokenizer.chat_template is not None:
        files["chat_template.jinja"] = tokenizer.chat_template
    for name, text in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
            file.write(text)
    return list(files)
