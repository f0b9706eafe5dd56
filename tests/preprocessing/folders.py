"""Hugging Face folders the text tests write (nothing is downloaded): a byte-level BPE
tokenizer trained with `tokenizers` on a few Shakespeare lines, saved as a realistic folder
(its `tokenizer.json` carrying padding to 16 and truncation at 16, which must not leak;
`tokenizer_config.json` with special tokens and a chat template; `special_tokens_map.json`),
and a tiny Llama with random weights beside it."""

import json
import pathlib

SHAKESPEARE = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
    "And by opposing end them. To die, to sleep;",
    "No more; and by a sleep to say we end",
    "The heart-ache and the thousand natural shocks",
    "That flesh is heir to: 'tis a consummation",
]
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]
SPECIAL = [BOS, EOS, PAD] + CHAT_TOKENS  # ids 0 .. 4
VOCABULARY_SIZE = 320
# Padding and truncation that a sentence-transformers folder would save: never to leak.
SAVED_LENGTH = 16
# ChatML with a system default, `bos_token`, `raise_exception` and block tags on their own
# lines (trim_blocks / lstrip_blocks decide the whitespace).
CHAT_TEMPLATE = """{{ bos_token }}
{% if messages[0]['role'] != 'system' %}
{{ '<|im_start|>system\\nYou are a player.<|im_end|>\\n' }}
{% endif %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
{{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{% endif %}"""


def train_tokenizer(lines=SHAKESPEARE, vocabulary_size=VOCABULARY_SIZE, padding=True):
    """A byte-level BPE `tokenizers.Tokenizer` whose post-processor starts each text with
    `<s>` (as Llama's does), with padding and truncation at `SAVED_LENGTH` when `padding`."""
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocabulary_size, special_tokens=SPECIAL,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(lines * 4, trainer)
    bpe.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    if padding:
        bpe.enable_padding(length=SAVED_LENGTH, pad_id=2, pad_token=PAD)
        bpe.enable_truncation(SAVED_LENGTH)
    return bpe


def write_tokenizer_folder(path, chat_template=CHAT_TEMPLATE, template_file=None,
                           tokenizer_config=True):
    """Writes the tokenizer files into `path`: `tokenizer.json`, and with
    `tokenizer_config` its config (special tokens, `chat_template`) and
    `special_tokens_map.json`; `template_file` also writes `chat_template.jinja`."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(path / "tokenizer.json"))
    if tokenizer_config:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS,
                  "eos_token": EOS, "pad_token": {"content": PAD, "special": True},
                  "model_max_length": 64, "chat_template": chat_template}
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        (path / "special_tokens_map.json").write_text(
            json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    return path


def write_llama_folder(path, tokenizer=True):
    """A tiny Llama (random weights, seed 0) saved by `transformers`, with the tokenizer
    files when `tokenizer`; returns `(path, model)`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCABULARY_SIZE, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = transformers.LlamaForCausalLM(config).eval()
    path = pathlib.Path(path)
    model.save_pretrained(path)
    if tokenizer:
        write_tokenizer_folder(path)
    return path, model


def docstring_calls(obj):
    """The source lines of the examples in `obj`'s docstring, `# doctest: +SKIP` ones left
    out (they need a real folder)."""
    import doctest

    examples = doctest.DocTestParser().get_examples(obj.__doc__ or "")
    return [e.source for e in examples if doctest.SKIP not in e.options]
