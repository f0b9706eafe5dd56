"""The tokenizer a GGUF file's metadata describes, rebuilt as a `tokenizers` tokenizer.

A GGUF file has no `tokenizer.json`; llama.cpp stores the vocabulary under `tokenizer.ggml.*`:
`model` (`"gpt2"`: byte-level BPE; `"llama"`: SentencePiece BPE with byte fallback), `tokens`,
`token_type` (3 control, 4 user-defined), `merges` (SentencePiece files may leave them out:
they follow from the vocabulary and `scores`), the special ids, `add_bos_token` /
`add_eos_token`, `add_space_prefix`, `pre` (the split regex a byte-level vocabulary was
learned with) and `tokenizer.chat_template`. The pieces below are those `transformers`'
GGUF converter gives the same vocabulary (its `GPT2Tokenizer`, `LlamaTokenizer` and
`GemmaTokenizer` layouts), so both tokenize alike.
"""

from keras_xf.preprocessing import HuggingFaceTokenizer

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's `tokenizer.ggml.pre` names → the split regex; others split as GPT-2 does.
SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
          "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
MODELS = ("gpt2", "llama")
CONTROL, USER_DEFINED = 3, 4


def _merges_from_scores(tokens, scores):
    """SentencePiece merges implied by a vocabulary: every split of a token into two tokens,
    best score first (`transformers`' `generate_merges`)."""
    vocabulary = {token: index for index, token in enumerate(tokens)}
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocabulary and token[i:] in vocabulary]
        merges += sorted(local, key=lambda m: (vocabulary[m[0]], vocabulary[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _model(kind, architecture, tokens, metadata, tokenizers):
    """The BPE model, pre-tokenizer, normaliser and decoder of a vocabulary."""
    merges = metadata.get("tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges] if merges is not None else None
    if kind == "gpt2":
        bpe = tokenizers.models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                    merges=merges or [])
        tokenizer = tokenizers.Tokenizer(bpe)
        split = SPLITS.get(metadata.get("tokenizer.ggml.pre"))
        byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                         use_regex=split is None)
        tokenizer.pre_tokenizer = byte_level if split is None else (
            tokenizers.pre_tokenizers.Sequence([tokenizers.pre_tokenizers.Split(
                tokenizers.Regex(split), behavior="isolated"), byte_level]))
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        return tokenizer
    if architecture == "gemma":  # spaces stored as spaces; merges in the vocabulary's order
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)))
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    bpe = tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merges if merges is not None else _merges_from_scores(tokens, scores),
        unk_token=tokens[unknown] if unknown is not None else None,
        fuse_unk=True, byte_fallback=True)
    tokenizer = tokenizers.Tokenizer(bpe)
    decoders = [tokenizers.decoders.Replace("\u2581", " "), tokenizers.decoders.ByteFallback(),
                tokenizers.decoders.Fuse()]
    if architecture == "gemma":
        tokenizer.normalizer = tokenizers.normalizers.Replace(" ", "\u2581")
    else:
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
        decoders += [tokenizers.decoders.Strip(content=" ", left=1)] if prefix else []
    tokenizer.decoder = tokenizers.decoders.Sequence(decoders)
    return tokenizer


def gguf_tokenizer(metadata, source):
    """The `HuggingFaceTokenizer` of a GGUF file's metadata (`{key: value}`), with its special
    tokens and chat template; `None` when the file has no vocabulary.

    Raises:
        ValueError: a tokenizer model other than those in `MODELS`, named with `source`.
    """
    import tokenizers

    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        return None
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in MODELS:
        raise ValueError(f"The GGUF file {source} has tokenizer model {kind!r}; keras_xf "
                         f"builds {list(MODELS)}.")
    tokenizer = _model(kind, metadata.get("general.architecture"), tokens, metadata,
                       tokenizers)
    types = metadata.get("tokenizer.ggml.token_type") or []
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                                  for t, k in zip(tokens, types) if k == CONTROL])
    tokenizer.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False)
                          for t, k in zip(tokens, types) if k == USER_DEFINED])
    special = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            special[name] = tokens[token_id]
    # llama.cpp starts SentencePiece texts with the start token unless a file says otherwise.
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    template = (["bos_token"] if add_bos and "bos_token" in special else []) + ["$A"] + (
        ["eos_token"] if add_eos and "eos_token" in special else [])
    if len(template) > 1:
        pieces = [special.get(p, p) for p in template]
        tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
            single=" ".join(pieces), pair=" ".join(pieces + [p.replace("$A", "$B")
                                                             for p in pieces]),
            special_tokens=[(special[p], tokenizer.token_to_id(special[p]))
                            for p in template if p != "$A"])
    return HuggingFaceTokenizer(tokenizer_json=tokenizer.to_str(), special_tokens=special,
                                chat_template=metadata.get("tokenizer.chat_template"))
