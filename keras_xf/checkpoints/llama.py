"""Llama, Mistral and Qwen2 (`*ForCausalLM`) ↔ a pre-norm RMSNorm `CausalLM` with rotary
attention (grouped-query) and a SwiGLU feedforward.

The three share one layout; Mistral adds a sliding attention window and Qwen2 biases on the
query, key and value projections. Gemma and Mixtral (`gemma.py`, `mixtral.py`) reuse the
pieces here: `rotary_attention`, `decoder_lm`, `tensor_map` and `check_decoder`.
"""

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.attention.patterns.local_pattern import LocalPattern
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.embeddings.rotary_embedding import RotaryEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM"}


def _sliding_window(config):
    """Mistral's (and Mixtral's) window of `sliding_window` keys (the query's own included),
    or `None`."""
    kind = config.get("model_type", "llama")
    if kind == "qwen2" and config.get("use_sliding_window"):
        raise ValueError("Qwen2 checkpoints with use_sliding_window=True (a window on some "
                         "layers only) are not supported.")
    window = config.get("sliding_window") if kind in ("mistral", "mixtral") else None
    return None if window is None else LocalPattern(window_left=int(window) - 1)


def rope_settings(config):
    """`(base, RotaryEmbedding arguments)` from `rope_parameters` (or the older
    `rope_theta` and `rope_scaling` keys)."""
    parameters = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    theta = parameters.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = parameters.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    source = parameters if "rope_type" in parameters else scaling
    arguments = {"max_wavelength": float(theta)}
    if kind == "linear":
        arguments["scaling_factor"] = float(source["factor"])
    elif kind == "llama3":
        arguments["frequency_scaling"] = {
            key: float(source[key]) for key in
            ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        }
    elif kind != "default":
        raise ValueError(f"rope_type={kind!r} is not supported; keras_xf reads 'default', "
                         "'linear' and 'llama3'.")
    return arguments


def rotary_attention(config, use_bias=None, output_bias=None):
    """The grouped-query `MultiHeadAttention` with RoPE (and Mistral's window) of `config`;
    biases on all four projections when `attention_bias` (or `use_bias`) is set."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return MultiHeadAttention(
        heads, head_dim=head_dim,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        use_bias=bool(config.get("attention_bias", False)) if use_bias is None else use_bias,
        output_bias=output_bias,
        position=RotaryEmbedding(**rope_settings(config)),
        pattern=_sliding_window(config),
    )


def decoder_lm(config, block, dtype=None, tie_embeddings=False, embedding_scale=False):
    """The `CausalLM` of `config` with the pre-norm `block` template and RoPE in attention."""
    return CausalLM(
        vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        hidden_dim=config["hidden_size"], block=block, position="none",
        max_sequence_length=config.get("max_position_embeddings", 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", tie_embeddings)),
        embedding_scale=embedding_scale, dtype=dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    qwen2 = config.get("model_type") == "qwen2"
    attention = rotary_attention(config, use_bias=True if qwen2 else None,
                                 output_bias=False if qwen2 else None)
    block = TransformerBlock(
        attention,
        FeedForward(config["intermediate_size"],
                    activation=parts.activation(config, "hidden_act", gated=True),
                    use_bias=bool(config.get("mlp_bias", False))),
        normalization="rms_norm", norm_placement="pre", epsilon=config.get("rms_norm_eps", 1e-6),
    )
    return decoder_lm(config, block, dtype)


def _mlp(prefix, feedforward):
    return parts.gated_feedforward(f"{prefix}.mlp", feedforward)


def tensor_map(model, config, feedforward=_mlp):
    """Every tensor of a Llama-layout checkpoint; `feedforward(layer_prefix, layer)` gives
    the entries of each layer's feedforward (`{prefix}.mlp.*` of a gated `FeedForward`)."""
    backbone = model.backbone
    stack = backbone.transformer_stack
    entries = [copy("model.embed_tokens.weight", backbone.embeddings.token_embedding.embeddings)]
    for index, block in enumerate(stack.blocks):
        prefix = f"model.layers.{index}"
        entries += (parts.norm(f"{prefix}.input_layernorm", block.mixer_residual.norm)
                    + parts.attention(f"{prefix}.self_attn", block.mixer)
                    + parts.norm(f"{prefix}.post_attention_layernorm",
                                 block.feedforward_residual.norm)
                    + feedforward(prefix, block.feedforward))
    entries += parts.norm("model.norm", stack.output_norm)
    ignored = [r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"]
    entries += parts.output_projection(backbone, ignored)
    return TensorMap(entries, ignored)


def check_decoder(model, normalization="rms_norm", embedding_scale=False, pattern=True):
    """`(backbone, block)` of a CausalLM of pre-norm `normalization` blocks of rotary
    multi-head attention (a sliding window when `pattern`), or a `ValueError`."""
    backbone = model.backbone if isinstance(model, CausalLM) else None
    if backbone is None or backbone.position != "none":
        raise ValueError("These families are CausalLMs with position='none' and RoPE in "
                         "their attention.")
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mha = block.mixer
    rope = mha.position if isinstance(mha, MultiHeadAttention) else None
    fits = (
        type(block) is TransformerBlock and type(rope) is RotaryEmbedding
        and parts.is_plain_attention(mha, position=True, pattern=pattern)
        and (mha.pattern is None or (type(mha.pattern) is LocalPattern
                                     and mha.pattern.window_right == 0))
        and block.norm_placement == "pre" and block.normalization == normalization
        and block.cross_attention is None and backbone.embedding_scale == embedding_scale
        and backbone.embedding_normalization is None
        and parts.has_one_template(stack)
    )
    if not fits:
        raise ValueError(f"The block must be pre-norm {normalization} around rotary multi-head "
                         f"attention{' (a sliding window at most)' if pattern else ''}, with "
                         f"embedding_scale={embedding_scale} and no embedding_normalization.")
    return backbone, block


def decoder_config(model, backbone, block, intermediate_size):
    """The keys that the Llama-layout configs share."""
    mha = block.mixer
    return {
        "vocab_size": backbone.vocabulary_size, "hidden_size": backbone.hidden_dim,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": backbone.transformer_stack.num_layers,
        "num_attention_heads": mha.num_heads, "num_key_value_heads": mha.num_key_value_heads,
        "head_dim": mha.head_dim or backbone.hidden_dim // mha.num_heads,
        "max_position_embeddings": backbone.max_sequence_length,
        "rms_norm_eps": block.epsilon, "attention_bias": mha.use_bias,
        "tie_word_embeddings": backbone.tie_embeddings, "pad_token_id": model.pad_token_id,
        "rope_parameters": _rope_parameters(mha.position),
    }


def hf_config(model):
    """The config of `model` as a Llama, Mistral (a sliding window) or Qwen2 (query, key and
    value biases without an output bias), or a `ValueError` naming what none expresses."""
    backbone, block = check_decoder(model)
    mha, ffn = block.mixer, block.feedforward
    if type(ffn) is not FeedForward or ffn.activation != "swiglu":
        raise ValueError("Llama needs pre-norm RMSNorm blocks of rotary multi-head attention "
                         "and a SwiGLU feedforward.")
    config = decoder_config(model, backbone, block, ffn.hidden_dim)
    config.update(hidden_act="silu", mlp_bias=ffn.use_bias)
    if mha.pattern is not None:
        if mha.use_bias or ffn.use_bias:
            raise ValueError("Mistral (a sliding window) has no biases.")
        config.update(model_type="mistral", sliding_window=mha.pattern.window_left + 1)
    elif mha.use_bias and not mha.output_bias:
        if ffn.use_bias:
            raise ValueError("Qwen2 has no feedforward biases.")
        config.update(model_type="qwen2", use_sliding_window=False, sliding_window=None)
    elif mha.use_bias != mha.output_bias:
        raise ValueError("Llama has biases in all four attention projections or in none.")
    else:
        config["model_type"] = "llama"
    config["architectures"] = [MODEL_TYPES[config["model_type"]]]
    return config


def _rope_parameters(rope):
    parameters = {"rope_theta": rope.max_wavelength, "rope_type": "default"}
    if rope.frequency_scaling:
        parameters.update(rope.frequency_scaling, rope_type="llama3")
    elif rope.scaling_factor != 1.0:
        parameters.update(rope_type="linear", factor=rope.scaling_factor)
    return parameters
