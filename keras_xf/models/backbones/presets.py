"""Named architectures (configs only, no weights): the survey's base and big Transformers and
a GPT-2-small-like decoder.

`Seq2SeqLM.from_preset("transformer_base")`, `CausalLM.from_preset("gpt2_small")`; any
argument can be overridden: `CausalLM.from_preset("gpt2_small", num_layers=2)`.
"""

PRESETS = {
    # Survey §2.5 / Table 1 (Vaswani et al. 2017): 6+6 layers, post-norm, sinusoidal
    # positions, shared embeddings, ReLU FFN.
    "transformer_base": {
        "task": "seq2seq_lm",
        "config": dict(vocabulary_size=32000, num_layers=6, hidden_dim=512, num_heads=8,
                       intermediate_dim=2048, max_sequence_length=512, position="sinusoidal",
                       norm_placement="post", activation="relu", dropout=0.1,
                       share_embeddings=True, tie_embeddings=True, embedding_scale=True),
    },
    "transformer_big": {
        "task": "seq2seq_lm",
        "config": dict(vocabulary_size=32000, num_layers=6, hidden_dim=1024, num_heads=16,
                       intermediate_dim=4096, max_sequence_length=512, position="sinusoidal",
                       norm_placement="post", activation="relu", dropout=0.3,
                       share_embeddings=True, tie_embeddings=True, embedding_scale=True),
    },
    # GPT-2 small: 12 pre-norm layers, width 768, 12 heads, tanh-approximated GELU (GPT-2's
    # "gelu_new"), learned positions, tied.
    "gpt2_small": {
        "task": "causal_lm",
        "config": dict(vocabulary_size=50257, num_layers=12, hidden_dim=768, num_heads=12,
                       intermediate_dim=3072, max_sequence_length=1024, position="learned",
                       norm_placement="pre", activation="gelu_tanh", dropout=0.1,
                       tie_embeddings=True),
    },
    # A BERT-base-like encoder for TextEncoder / TextClassifier (exact GELU, as BERT).
    "bert_base": {
        "task": "text_encoder",
        "config": dict(vocabulary_size=30522, num_layers=12, hidden_dim=768, num_heads=12,
                       intermediate_dim=3072, max_sequence_length=512, position="learned",
                       norm_placement="post", activation="gelu", dropout=0.1),
    },
}


def preset_names(task=None):
    """Names of the presets, optionally those of one task kind."""
    return sorted(name for name, p in PRESETS.items() if task is None or p["task"] == task)


def preset_config(name, task, **overrides):
    """The keyword arguments of preset `name` for a model of kind `task`, with overrides."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset. Received: preset={name!r}; known: {preset_names()}")
    preset = PRESETS[name]
    config = dict(preset["config"])
    if preset["task"] != task:
        compatible = {("text_encoder", "text_classifier"), ("causal_lm", "text_encoder")}
        if (preset["task"], task) not in compatible and task != "text_encoder":
            raise ValueError(
                f"Preset {name!r} describes a {preset['task']} model, not a {task} one."
            )
        for key in ("share_embeddings",):
            config.pop(key, None)
    config.update(overrides)
    return config
