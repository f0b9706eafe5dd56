"""A llama.cpp GGUF file's metadata and tensor names in Hugging Face terms: the `config.json`
dict of the model it holds, and each tensor's Hugging Face name and value transform.

llama.cpp's `convert_hf_to_gguf.py` writes the Llama family under the architectures `llama`
(Llama and Mistral), `qwen2` and `gemma`, its hyperparameters under `{architecture}.*` keys
and its tensors under GGML names (`blk.{i}.attn_q.weight`, `token_embd.weight`, ...). Two
values are changed on the way, and reversed here:
- `llama`'s query and key rows (weights and biases) are permuted within each head from Hugging
  Face's rotary layout (the first half of a head's dimensions, then the second) to GGML's
  interleaved pairs;
- `gemma`'s RMSNorm scales are stored as `1 + w` (Hugging Face stores `w`).
"""

import re

import numpy as np

# GGUF architecture → (Hugging Face architecture, model_type, hidden activation).
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", "silu"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", "silu"),
    "gemma": ("GemmaForCausalLM", "gemma", "gelu_pytorch_tanh"),
}
# GGML names of a block's tensors → Hugging Face names.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_MISSING = object()


def hf_name(name):
    """The Hugging Face name of the GGML tensor `name`; a name outside the Llama layout is
    returned as it is (the loader then names it as a tensor that no variable takes)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match and match.group(2) in _LAYER_NAMES:
        index, module, kind = match.groups()
        return f"model.layers.{index}.{_LAYER_NAMES[module]}.{kind}"
    return name


def _unpermute(array, heads):
    """The inverse of llama.cpp's rotary permutation of `heads` heads' rows."""
    rows = array.shape[0]
    return (array.reshape(heads, rows // heads // 2, 2, *array.shape[1:])
            .swapaxes(1, 2).reshape(array.shape))


def to_hf_value(architecture, config, name, array):
    """The Hugging Face value of the GGML tensor `name` (already dequantised to float32)."""
    if architecture == "llama" and re.fullmatch(r"blk\.\d+\.attn_[qk]\.(weight|bias)", name):
        heads = (config["num_attention_heads"] if ".attn_q." in name
                 else config["num_key_value_heads"])
        return _unpermute(array, heads)
    if architecture == "gemma" and name.endswith("norm.weight"):
        return array - np.float32(1.0)
    return array


def _uniform(value, key, source):
    """A per-layer list that must hold one value (keras_xf's stacks repeat one block)."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"The GGUF file {source} gives {key} per layer ({value}); keras_xf "
                             "loads models whose layers all have the same size.")
        return value[0]
    return value


def hf_config(metadata, shapes, source):
    """The Hugging Face config dict of a GGUF file of the Llama family.

    Args:
        metadata: `{key: value}` of the file's metadata.
        shapes: `{GGML tensor name: shape}` of its tensors.
        source: how messages name the file.

    Raises:
        ValueError: another architecture, a missing hyperparameter, or a setting keras_xf
            does not express (partial rotary dimensions, YaRN scaling, per-dimension
            frequency factors), named.
    """
    architecture = metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"The GGUF file {source} holds architecture {architecture!r}, which keras_xf does "
            f"not load. Loadable GGUF architectures: {sorted(ARCHITECTURES)} (Llama and "
            "Mistral are 'llama').")

    def key(name, default=_MISSING):
        full = f"{architecture}.{name}"
        if full not in metadata:
            if default is _MISSING:
                raise ValueError(f"The GGUF file {source} lacks the metadata key {full!r}.")
            return default
        return _uniform(metadata[full], full, source)

    if "rope_freqs.weight" in shapes:
        raise ValueError(f"The GGUF file {source} has rope_freqs.weight (per-dimension rotary "
                         "frequency factors, as Llama 3.1's scaling is stored), which keras_xf "
                         "does not read.")
    hf_architecture, model_type, activation = ARCHITECTURES[architecture]
    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    value_dim = int(key("attention.value_length", head_dim))
    rotary = int(key("rope.dimension_count", head_dim))
    if value_dim != head_dim or rotary != head_dim:
        raise ValueError(
            f"The GGUF file {source} has key length {head_dim}, value length {value_dim} and "
            f"{rotary} rotary dimensions; keras_xf loads files where the three are equal.")
    tokens = metadata.get("tokenizer.ggml.tokens")
    embedding = shapes.get("token_embd.weight")
    vocabulary = key("vocab_size", None) or (len(tokens) if tokens else None) or (
        embedding[0] if embedding else None)
    config = {
        "architectures": [hf_architecture], "model_type": model_type,
        "vocab_size": int(vocabulary), "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_act": activation,
        "tie_word_embeddings": "output.weight" not in shapes,
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(key("rope.freq_base", 10000.0))},
    }
    scaling = key("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_parameters"].update(rope_type="linear",
                                         factor=float(key("rope.scaling.factor")))
    elif scaling != "none":
        raise ValueError(f"The GGUF file {source} has rope scaling {scaling!r}; keras_xf reads "
                         "'none' and 'linear'.")
    if architecture == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
    for name in ("bos", "eos", "padding"):
        token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config
