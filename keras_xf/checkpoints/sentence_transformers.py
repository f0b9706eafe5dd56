"""A sentence-transformers folder read as keras_xf `TextEncoder` arguments.

A folder that `SentenceTransformer.save` writes lists its modules in `modules.json`: the
transformer (its `config.json`, safetensors and tokenizer at `path` `""` or `0_Transformer`),
then `Pooling`, an optional `Dense` (`act(W · p + b)`) and an optional `Normalize` (L2).
`TextEncoder` computes `normalize(act(W · Pool(Encoder(x)) + b))` in that same order, so each
module becomes one argument: `pooling`, `projection_dim` and `projection_activation`,
`normalize`. What only tokenization reads (`max_seq_length`, `do_lower_case`,
`include_prompt`) is returned by `sentence_transformers_settings` for a text layer to apply.
"""

import json
import os

MODULES = "modules.json"
# sentence-transformers' pooling modes (its `pooling_mode` values, and the legacy boolean
# `pooling_mode_*` keys of the same modes, in its concatenation order) and keras_xf's.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING = {"cls": "cls", "max": "max", "mean": "mean"}
# `torch.nn` activations of a `Dense` module (its config's `activation_function`) ↔ Keras.
ACTIVATIONS = {
    "Tanh": "tanh", "Identity": None, "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid",
    "SiLU": "silu",
}
# The Transformer module's config, under the names sentence-transformers has used for it.
TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                       "sentence_distilbert_config.json", "sentence_camembert_config.json",
                       "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                       "sentence_xlnet_config.json")


def is_sentence_transformers_folder(directory):
    """Whether `directory` is a sentence-transformers folder (it holds `modules.json`)."""
    return os.path.isfile(os.path.join(os.fspath(directory), MODULES))


def _read_json(path, default=None):
    if not os.path.isfile(path):
        if default is not None:
            return default
        raise ValueError(f"The sentence-transformers folder lacks {path}.")
    with open(path) as file:
        return json.load(file)


def _kind(module):
    """A module's class name: `Pooling` of `sentence_transformers.models.Pooling` (older
    folders) and of `sentence_transformers.sentence_transformer.modules.pooling.Pooling`."""
    return module.get("type", "").rsplit(".", 1)[-1]


def pooling_mode(config, path="1_Pooling/config.json"):
    """The keras_xf `Pooling` mode of a sentence-transformers `Pooling` config.

    Args:
        config: the module's `config.json` dict: `pooling_mode` (a name or a list), or the
            older boolean `pooling_mode_*_tokens` / `pooling_mode_cls_token` /
            `pooling_mode_lasttoken` keys (none set means mean, as sentence-transformers reads
            them).
        path: how messages name the config.

    Returns:
        `"mean"`, `"cls"` or `"max"`.

    Raises:
        ValueError: several modes at once, or a mode keras_xf has no pooling for
            (`mean_sqrt_len_tokens`, `weightedmean`, `lasttoken`), named in the message.

    Example:
    >>> pooling_mode({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    'cls'
    """
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key, False)]
        modes = modes or ["mean"]
    if len(modes) != 1:
        raise ValueError(f"{path} concatenates the pooling modes {modes}; keras_xf pools with "
                         f"one of {sorted(POOLING)}. Received: pooling_mode={modes}")
    if modes[0] not in POOLING:
        raise ValueError(f"{path} pools with {modes[0]!r}, which keras_xf has no pooling for: "
                         f"expected one of {sorted(POOLING)}. Received: "
                         f"pooling_mode={modes[0]!r}")
    return POOLING[modes[0]]


def _check_feature(config, path):
    """A Dense or Normalize module must act on the pooled `sentence_embedding`."""
    for key in ("module_input_name", "module_output_name"):
        name = config.get(key) or "sentence_embedding"
        if name != "sentence_embedding":
            raise ValueError(f"{path} acts on {name!r}; keras_xf reads modules acting on the "
                             f"pooled 'sentence_embedding'. Received: {key}={name!r}")


def _dense(config, directory, path):
    """`{"directory", "in_features", "out_features", "bias", "activation"}` of a Dense."""
    _check_feature(config, path)
    if config.get("use_residual", False):
        raise ValueError(f"{path} adds a residual to its projection, which a TextEncoder's "
                         "projection has not. Received: use_residual=True")
    function = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    name = (function or "Identity").rsplit(".", 1)[-1]
    if name not in ACTIVATIONS:
        raise ValueError(f"{path} has activation_function={function!r}; keras_xf reads "
                         f"torch.nn's {sorted(ACTIVATIONS)}.")
    if not os.path.isfile(os.path.join(directory, "model.safetensors")):
        raise ValueError(f"The Dense module in {directory} holds no model.safetensors: keras_xf "
                         "reads safetensors checkpoints only (save the model again with "
                         "safe_serialization=True).")
    return {"directory": directory, "in_features": config["in_features"],
            "out_features": config["out_features"], "bias": config.get("bias", True),
            "activation": ACTIVATIONS[name]}


class SentenceTransformersFolder:
    """The modules of a sentence-transformers folder, as `TextEncoder` arguments.

    Args:
        directory: a folder written by `SentenceTransformer.save` (or `save_pretrained`):
            `modules.json` listing a `Transformer`, a `Pooling`, and optionally a `Dense` and
            a `Normalize`.

    Attributes:
        transformer_directory: the transformer's Hugging Face folder (`config.json`,
            safetensors, tokenizer files).
        pooling: `"mean"`, `"cls"` or `"max"`.
        dense: `None`, or a dict with `directory` (its `model.safetensors` holds
            `linear.weight` `[out, in]` and `linear.bias`), `in_features`, `out_features`,
            `bias` and `activation` (a Keras name, or `None` for `Identity`).
        normalize: whether a `Normalize` module follows.
        settings: `sentence_transformers_settings(directory)`.

    Raises:
        ValueError: a module keras_xf has no counterpart for (named by type), a pooling mode
            it cannot express (or pooling without the prompt, `include_prompt=False`), a module order other than Transformer, Pooling, Dense,
            Normalize, or a missing file.

    Example:
    >>> folder = SentenceTransformersFolder("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> folder.pooling, folder.normalize  # doctest: +SKIP
    ('mean', True)
    """

    def __init__(self, directory):
        directory = os.fspath(directory)
        self.directory = directory
        modules = _read_json(os.path.join(directory, MODULES))
        modules = sorted(modules, key=lambda m: m.get("idx", 0))
        kinds = [_kind(m) for m in modules]
        order = ["Transformer", "Pooling", "Dense", "Normalize"]
        unknown = [m.get("type") for m, k in zip(modules, kinds) if k not in order]
        if unknown:
            raise ValueError(f"{os.path.join(directory, MODULES)} lists modules that keras_xf "
                             f"has no counterpart for: {unknown}. Expected: {order}, in order, "
                             "Dense and Normalize optional.")
        if (kinds[:2] != order[:2] or len(set(kinds)) != len(kinds)
                or kinds != sorted(kinds, key=order.index)):
            raise ValueError(f"{os.path.join(directory, MODULES)} must list Transformer, "
                             f"Pooling, then optionally Dense and Normalize. Received: {kinds}")
        paths = {k: os.path.join(directory, m.get("path", "")) for k, m in zip(kinds, modules)}
        self.transformer_directory = paths["Transformer"]
        pooling_path = os.path.join(paths["Pooling"], "config.json")
        self.pooling = pooling_mode(_read_json(pooling_path), pooling_path)
        self.dense = None
        if "Dense" in paths:
            dense_path = os.path.join(paths["Dense"], "config.json")
            self.dense = _dense(_read_json(dense_path), paths["Dense"], dense_path)
        self.normalize = "Normalize" in paths
        if self.normalize:
            normalize_path = os.path.join(paths["Normalize"], "config.json")
            _check_feature(_read_json(normalize_path, default={}), normalize_path)
        self.settings = sentence_transformers_settings(directory)
        if not self.settings["include_prompt"]:
            raise ValueError(f"{pooling_path} pools without the prompt's tokens; a keras_xf "
                             "TextEncoder pools over every token of its input. Received: "
                             "include_prompt=False")


def sentence_transformers_settings(directory):
    """The tokenization settings of a sentence-transformers folder, which the `TextEncoder`
    that `from_huggingface` loads does not apply: a text layer before it does.

    Args:
        directory: a sentence-transformers folder (with `modules.json`).

    Returns:
        A dict: `max_seq_length` (tokens kept per text, `[CLS]` and `[SEP]` included:
        the Transformer module's `max_seq_length`, else its tokenizer's `model_max_length`,
        else `None`), `do_lower_case` (sentence-transformers lowercases texts before its
        tokenizer: the Transformer module's flag; a tokenizer's own lowercasing is in its
        `tokenizer.json`), `include_prompt` (`False`: prompt tokens are left out of the
        pooling), `prompts` (`{name: text prefixed to the input}`, from
        `config_sentence_transformers.json`; `{}` without) and `default_prompt_name` (the
        prompt `encode` prefixes when given none, or `None`).

    Raises:
        ValueError: `directory` has no `modules.json`, or its modules lack a Transformer.

    Example:
    >>> settings = sentence_transformers_settings("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> settings["max_seq_length"], settings["do_lower_case"]  # doctest: +SKIP
    (256, False)
    """
    directory = os.fspath(directory)
    if not is_sentence_transformers_folder(directory):
        raise ValueError(f"directory must be a sentence-transformers folder with {MODULES}. "
                         f"Received: directory={directory!r}")
    modules = _read_json(os.path.join(directory, MODULES))
    paths = {_kind(m): os.path.join(directory, m.get("path", "")) for m in modules}
    if "Transformer" not in paths:
        raise ValueError(f"{os.path.join(directory, MODULES)} lists no Transformer module. "
                         f"Received: {[m.get('type') for m in modules]}")
    transformer = paths["Transformer"]
    config = next((_read_json(os.path.join(transformer, name))
                   for name in TRANSFORMER_CONFIGS
                   if os.path.isfile(os.path.join(transformer, name))), {})
    tokenizer = _read_json(os.path.join(transformer, "tokenizer_config.json"), default={})
    length = config.get("max_seq_length")
    if length is None:
        length = tokenizer.get("model_max_length")
        # `transformers` writes a huge sentinel when a tokenizer has no limit.
        length = length if isinstance(length, int) and length < 10**9 else None
    include_prompt = True
    if "Pooling" in paths:
        pooling = _read_json(os.path.join(paths["Pooling"], "config.json"), default={})
        include_prompt = bool(pooling.get("include_prompt", True))
    model = _read_json(os.path.join(directory, "config_sentence_transformers.json"), default={})
    return {"max_seq_length": length, "do_lower_case": bool(config.get("do_lower_case", False)),
            "include_prompt": include_prompt,
            # sentence-transformers reads a prompt saved as null as the empty prompt.
            "prompts": {name: text or "" for name, text in (model.get("prompts") or {}).items()},
            "default_prompt_name": model.get("default_prompt_name")}
