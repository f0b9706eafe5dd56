"""The tokenizer of a Hugging Face checkpoint folder, through the `tokenizers` library."""

import os

import numpy as np


class HuggingFaceTokenizer:
    """A folder's `tokenizer.json` (read by the `tokenizers` library) with the calls of a
    keras-hub tokenizer: strings to id lists and back.

    `tokenize` returns ragged Python lists, the prompt form that `generate` takes, and
    `detokenize` reads what `generate` returns for them.

    Args:
        directory: a checkpoint folder with `tokenizer.json`.

    Example:
    >>> tokenizer = HuggingFaceTokenizer("path/to/llama")  # doctest: +SKIP
    >>> ids = model.generate(tokenizer(["To be, or"]), max_length=32)  # doctest: +SKIP
    >>> tokenizer.detokenize(ids)  # doctest: +SKIP
    """

    def __init__(self, directory):
        path = os.path.join(os.fspath(directory), "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(f"directory must hold a tokenizer.json. Received: directory="
                             f"{os.fspath(directory)!r}")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError("Checkpoint tokenizers need the tokenizers package: "
                              "pip install 'keras-xf[checkpoints]'") from None
        self.tokenizer = Tokenizer.from_file(path)

    @property
    def vocabulary_size(self):
        return self.tokenizer.get_vocab_size()

    def token_to_id(self, token):
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id):
        return self.tokenizer.id_to_token(int(token_id))

    def tokenize(self, texts, add_special_tokens=True):
        """A string to its ids, or a list of strings to a list of id lists."""
        if isinstance(texts, str):
            return self.tokenizer.encode(texts, add_special_tokens=add_special_tokens).ids
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    __call__ = tokenize

    def detokenize(self, ids, skip_special_tokens=True):
        """Ids (a list, a list of lists, an array, or the dict that `generate` returns, its
        padding dropped) to a string or a list of strings."""
        if isinstance(ids, dict):
            keys = sorted(ids, key=lambda k: "mask" in k)  # the ids, then their mask
            rows, masks = np.asarray(ids[keys[0]]), np.asarray(ids[keys[1]]).astype(bool)
            ids = [row[mask].tolist() for row, mask in zip(rows, masks)]
        ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
        if ids and isinstance(ids[0], (list, tuple)):
            return self.tokenizer.decode_batch([list(map(int, r)) for r in ids],
                                               skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)
