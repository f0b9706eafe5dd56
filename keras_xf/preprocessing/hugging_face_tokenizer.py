"""The tokenizer of a Hugging Face folder, through the `tokenizers` library."""

import os

import keras

from keras_xf.ops.checks import check_bool
from keras_xf.preprocessing.chat_template import render_chat_template
from keras_xf.preprocessing.text_inputs import check_sequence_length
from keras_xf.preprocessing.text_inputs import fit_rows
from keras_xf.preprocessing.text_inputs import is_single_row
from keras_xf.preprocessing.text_inputs import pack_rows
from keras_xf.preprocessing.text_inputs import text_list
from keras_xf.preprocessing.text_inputs import unpadded_rows
from keras_xf.preprocessing.tokenizer_folder import SPECIAL_TOKENS
from keras_xf.preprocessing.tokenizer_folder import read_chat_template
from keras_xf.preprocessing.tokenizer_folder import read_special_tokens


def _tokenizers_module():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("Hugging Face tokenizers need the tokenizers package: "
                          "pip install 'keras-xf[text]'") from None
    return tokenizers


def _lowercased(normalizer, tokenizers):
    """`normalizer` with a `Lowercase` first, unless it (or a member of its sequence) is one:
    sentence-transformers' rule for `do_lower_case`."""
    normalizers = tokenizers.normalizers
    members = list(normalizer) if isinstance(normalizer, normalizers.Sequence) else (
        [] if normalizer is None else [normalizer])
    if any(isinstance(member, normalizers.Lowercase) for member in members):
        return normalizer
    return normalizers.Sequence([normalizers.Lowercase(), *members])


@keras.saving.register_keras_serializable(package="keras_xf")
class HuggingFaceTokenizer:
    """A folder's `tokenizer.json` (read by the `tokenizers` library) with the calls of a
    keras-hub tokenizer: strings to id lists and back, packed arrays, chat templates.

    The folder's own padding and truncation settings (sentence-transformers folders save
    fixed padding to 128) are switched off: `tokenize` returns ragged id lists, as
    `transformers` does; `pack` pads to a length you name and returns the padding mask;
    nothing is truncated unless `truncate=True`, and a text longer than `sequence_length`
    otherwise raises a `ValueError`. Special tokens come from `tokenizer_config.json`, then
    `special_tokens_map.json`, then the ids of `config.json`; the chat template from
    `chat_template.jinja`, else `tokenizer_config.json`.

    The config holds the `tokenizer.json` text, the special tokens and the chat template, so
    a model saved with this tokenizer in its preprocessor reloads without the folder.

    Args:
        directory: a folder with `tokenizer.json`; or leave it out and pass
        tokenizer_json: the text of a `tokenizer.json`;
        special_tokens: optional dict of special tokens by `transformers`' names
            (`"bos_token"`, `"eos_token"`, `"pad_token"`, `"unk_token"`, ...);
        chat_template: optional jinja2 chat template.
        lowercase: bool; `True` lowercases texts before the folder's own normaliser (a
            `tokenizers` `Lowercase` put first, unless the normaliser has one), as
            sentence-transformers does for a folder with `do_lower_case`. Special tokens
            written in the text stay as they are.

    Example:
    >>> tokenizer = HuggingFaceTokenizer("path/to/llama")  # doctest: +SKIP
    >>> ids = tokenizer(["To be, or", "not to be"])  # ragged id lists
    >>> batch = tokenizer.pack(["To be, or"], sequence_length=16)  # token_ids, padding_mask
    >>> tokenizer.detokenize(ids)
    >>> prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
    ...                                        add_generation_prompt=True)
    """

    def __init__(self, directory=None, tokenizer_json=None, special_tokens=None,
                 chat_template=None, lowercase=False):
        tokenizers = _tokenizers_module()
        self.lowercase = check_bool("lowercase", lowercase)
        if (directory is None) == (tokenizer_json is None):
            raise ValueError(
                "Pass either directory or tokenizer_json. Received: directory="
                f"{directory!r}, tokenizer_json of type {type(tokenizer_json).__name__}"
            )
        if directory is not None:
            directory = os.fspath(directory)
            path = os.path.join(directory, "tokenizer.json")
            if not os.path.isfile(path):
                raise ValueError(f"directory must hold a tokenizer.json. Received: directory="
                                 f"{directory!r}")
            with open(path, encoding="utf-8") as file:
                tokenizer_json = file.read()
        self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        # The folder's padding and truncation would leak into every call: off, as in
        # `transformers`, which pads and truncates only when asked.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        if self.lowercase:
            self.tokenizer.normalizer = _lowercased(self.tokenizer.normalizer, tokenizers)
        self.tokenizer_json = self.tokenizer.to_str()
        if directory is not None:
            special_tokens = read_special_tokens(directory, self.tokenizer.id_to_token)
            chat_template = read_chat_template(directory)
        special_tokens = dict(special_tokens or {})
        unknown = sorted(set(special_tokens) - set(SPECIAL_TOKENS))
        if unknown:
            raise ValueError(f"special_tokens takes keys among {list(SPECIAL_TOKENS)}. "
                             f"Received: keys {unknown}")
        self.special_tokens = special_tokens
        self.chat_template = chat_template

    # Vocabulary and special tokens ---------------------------------------------------------
    @property
    def vocabulary_size(self):
        return self.tokenizer.get_vocab_size()

    def token_to_id(self, token):
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id):
        return self.tokenizer.id_to_token(int(token_id))

    def _special_id(self, name):
        token = self.special_tokens.get(name)
        return None if token is None else self.tokenizer.token_to_id(token)

    @property
    def start_token_id(self):
        """The id of `bos_token`, or `None`."""
        return self._special_id("bos_token")

    @property
    def end_token_id(self):
        """The id of `eos_token`, or `None`."""
        return self._special_id("eos_token")

    @property
    def unk_token_id(self):
        """The id of `unk_token`, or `None`."""
        return self._special_id("unk_token")

    @property
    def pad_token_id(self):
        """The id of `pad_token`, else of `eos_token`, else 0: what packing pads with (the
        padding mask, not the id, tells the model where the text ends)."""
        for name in ("pad_token", "eos_token"):
            if self._special_id(name) is not None:
                return self._special_id(name)
        return 0

    @property
    def special_token_ids(self):
        """The sorted ids of every special token (those `detokenize` skips)."""
        added = self.tokenizer.get_added_tokens_decoder()
        ids = {i for i, token in added.items() if token.special}
        ids |= {self._special_id(name) for name in self.special_tokens}
        return sorted(i for i in ids if i is not None)

    @property
    def adds_start_token(self):
        """Whether `tokenize` with `add_special_tokens=True` starts a text with the start
        token (the folder's post-processor does, as Llama's)."""
        start = self.start_token_id
        return start is not None and self.tokenizer.encode("a").ids[:1] == [start]

    # Strings to ids and back -----------------------------------------------------------------
    def tokenize(self, texts, add_special_tokens=True, sequence_length=None, truncate=False):
        """A string to its ids, or a list of strings to a list of id lists (ragged).

        Args:
            texts: a string, or a list or array of strings.
            add_special_tokens: bool, those the folder's post-processor adds (Llama's
                `<s>`, BERT's `[CLS]` and `[SEP]`); `transformers`' default too.
            sequence_length: optional int, the most ids a text may have.
            truncate: bool; with `sequence_length`, cut longer texts (keeping the special
                tokens, as `transformers` does); without it they raise a `ValueError`.
        """
        single = isinstance(texts, (str, bytes))
        texts = text_list(texts)
        if sequence_length is not None:
            check_sequence_length(sequence_length)
        if truncate and sequence_length is None:
            raise ValueError("truncate=True needs the length to cut to: sequence_length. "
                             "Received: sequence_length=None")
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        if truncate:
            room = sequence_length - (self.tokenizer.num_special_tokens_to_add(False)
                                      if add_special_tokens else 0)
            if room < 0:
                raise ValueError(f"sequence_length leaves no room for the special tokens. "
                                 f"Received: sequence_length={sequence_length}")
            for encoding in encodings:
                encoding.truncate(room)
        if add_special_tokens:
            encodings = [self.tokenizer.post_process(e, add_special_tokens=True)
                         for e in encodings]
        rows = [encoding.ids for encoding in encodings]
        if sequence_length is not None:
            rows = fit_rows(rows, sequence_length, truncate=False)
        return rows[0] if single else rows

    __call__ = tokenize

    def pack(self, texts, sequence_length, add_special_tokens=True, truncate=False):
        """Texts as `{"token_ids", "padding_mask"}`, int32 `[B, sequence_length]`, padded on
        the right with `pad_token_id` (the mask is 1 on the ids); see `tokenize`."""
        rows = self.tokenize(text_list(texts), add_special_tokens=add_special_tokens,
                             sequence_length=check_sequence_length(sequence_length),
                             truncate=truncate)
        return pack_rows(rows, sequence_length, self.pad_token_id)

    def detokenize(self, ids, skip_special_tokens=True):
        """Ids (a list, a list of lists, an array, or a dict of ids and mask such as
        `generate` returns, its padding dropped) to a string or a list of strings."""
        rows = unpadded_rows(ids)
        texts = self.tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens)
        return texts[0] if is_single_row(ids) else texts

    # Chat ---------------------------------------------------------------------------------
    def apply_chat_template(self, conversation, add_generation_prompt=False, tokenize=False,
                            chat_template=None, **variables):
        """A conversation rendered with the folder's chat template, as `transformers`'
        `apply_chat_template` renders it (jinja2, the same settings; the special tokens
        `bos_token`, `eos_token`, ... are variables of the template).

        Args:
            conversation: a list of `{"role", "content"}` messages, or a list of such lists.
            add_generation_prompt: bool, end with the template's opening of the assistant's
                turn.
            tokenize: bool; `False` (the default here) returns the text, `True` its ids
                (without adding special tokens: the template writes them).
            chat_template: optional template to use instead of the folder's.
            **variables: other variables of the template (`tools`, `documents`, ...).

        Returns:
            A string (a list of strings for a list of conversations), or their ids.
        """
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError("This tokenizer has no chat template (chat_template.jinja or "
                             "tokenizer_config.json's chat_template): pass chat_template. "
                             "Received: chat_template=None")
        rendered = render_chat_template(template, conversation,
                                        add_generation_prompt=add_generation_prompt,
                                        **{**self.special_tokens, **variables})
        if tokenize:
            return self.tokenize(rendered, add_special_tokens=False)
        return rendered

    # Config -------------------------------------------------------------------------------
    def get_config(self):
        return {"tokenizer_json": self.tokenizer_json, "special_tokens": dict(self.special_tokens),
                "chat_template": self.chat_template, "lowercase": self.lowercase}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
