"""What a Hugging Face folder says about its tokenizer besides `tokenizer.json`: the special
tokens (`tokenizer_config.json`, `special_tokens_map.json`, then the ids of `config.json`)
and the chat template (`chat_template.jinja`, else `tokenizer_config.json`)."""

import json
import os

# The special tokens a tokenizer names, in `transformers`' terms.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                  "mask_token")


def read_json(directory, name):
    """The dict in `directory/name`, or `{}` when the file is absent."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def token_content(value):
    """A special token as written in a config: a string, or a dict with its `content`."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def read_special_tokens(directory, id_to_token):
    """`{name: token}` for the folder's special tokens: `tokenizer_config.json` first, then
    `special_tokens_map.json`, then the ids `bos_token_id`, `eos_token_id`, `pad_token_id`
    of `config.json` (the first of a list) turned into tokens by `id_to_token`."""
    found = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = read_json(directory, name)
        for key in SPECIAL_TOKENS:
            token = token_content(config.get(key))
            if key not in found and token is not None:
                found[key] = token
    model_config = read_json(directory, "config.json")
    for key in ("bos_token", "eos_token", "pad_token"):
        token_id = model_config.get(f"{key}_id")
        if isinstance(token_id, list):
            token_id = token_id[0] if token_id else None
        if key not in found and isinstance(token_id, int):
            token = id_to_token(token_id)
            if token is not None:
                found[key] = token
    return found


def read_chat_template(directory):
    """The folder's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s
    `chat_template` (a string, or a list of named templates: the `"default"` one), else
    `None`."""
    path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            return file.read()
    template = read_json(directory, "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template if isinstance(template, str) else None
