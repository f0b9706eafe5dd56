"""Chat templates rendered with jinja2, the engine and settings `transformers` uses
(`transformers.utils.chat_template_utils`): a sandboxed environment with `trim_blocks` and
`lstrip_blocks`, loop controls, `raise_exception`, `strftime_now` and a `tojson` filter that
does not escape HTML."""

import datetime
import functools
import json


def compiled_chat_template(template):
    """The compiled jinja2 template of a chat template string (kept per string)."""
    if not isinstance(template, str):
        raise ValueError(
            f"chat_template must be a string. Received: chat_template of type "
            f"{type(template).__name__}"
        )
    return _compile(template)


@functools.lru_cache(maxsize=16)
def _compile(template):
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("Chat templates need the jinja2 package: "
                          "pip install 'keras-xf[text]'") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment.from_string(template)


def render_chat_template(template, conversation, add_generation_prompt=False, tools=None,
                         documents=None, **variables):
    """`conversation` (a list of `{"role", "content"}` messages, or a list of such lists)
    rendered with `template`: a string, or a list of strings for a list of conversations.

    `variables` are the template's other names (`bos_token`, `eos_token`, ...), as
    `transformers` passes its special tokens.
    """
    if not isinstance(conversation, (list, tuple)):
        raise ValueError(
            "conversation must be a list of messages (dicts with 'role' and 'content') or a "
            f"list of such lists. Received: conversation of type {type(conversation).__name__}"
        )
    batched = len(conversation) > 0 and isinstance(conversation[0], (list, tuple))
    chats = [list(chat) for chat in conversation] if batched else [list(conversation)]
    for chat in chats:
        for message in chat:
            if not isinstance(message, dict):
                raise ValueError(
                    "Each message must be a dict with 'role' and 'content'. Received: a "
                    f"message of type {type(message).__name__}"
                )
    compiled = compiled_chat_template(template)
    rendered = [compiled.render(messages=chat, tools=tools, documents=documents,
                                add_generation_prompt=add_generation_prompt, **variables)
                for chat in chats]
    return rendered if batched else rendered[0]
