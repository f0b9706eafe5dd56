"""BLOOM (`BloomForCausalLM`) ↔ a pre-norm LayerNorm `CausalLM` with ALiBi attention and a
LayerNorm on the word embeddings.

What BLOOM computes, and the general options of the layers and models that express it:
- No position embedding (`position="none"`); attention scores get ALiBi's linear penalty
  (survey §7, Press et al.), `α_ij = Softmax(q_i·k_j / √d_h − m_h · (i − j))`:
  `MultiHeadAttention(biases=[AlibiBias()])`. BLOOM adds `m_h · j'` instead, with `j'` the
  key's position counted over the attention mask (`cumsum(mask) − 1`); the two differ by
  `m_h · i'`, a constant along each query's row, which the softmax removes (in left- and
  right-padded rows too: a row's real tokens shift together). The slopes
  `m_h = 2^(−8h/P)` for the largest power of two `P ≤ H`, then every other slope of `2P`
  heads, are `alibi_slopes(H)`.
- The word embeddings are normalised before the first layer (`word_embeddings_layernorm`):
  `CausalLM(embedding_normalization="layer_norm", embedding_epsilon=ε)`.
- Pre-norm LayerNorm blocks, a final `ln_f` (the stack's output norm), biases in every
  projection, a `4d` feedforward with the tanh GELU (`bloom_gelu_forward`):
  `FeedForward(4d, activation="gelu_tanh")`; the output projection tied to the embeddings.
- The fused `query_key_value` weight `[3d, d]` is laid out per head: its outputs are
  `[H, 3, Dh]` (head-major, then query / key / value; `BloomAttention._reshape`), not GPT-2's
  `[3, H, Dh]`.

`pretraining_tp` with `slow_but_exact` only changes the order in which `transformers` sums
the output projections (the same function), so both load; the post-norm residual of
`apply_residual_connection_post_layernorm=True` is refused.
"""

import numpy as np

from keras_xf.layers.attention.alibi_bias import AlibiBias
from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy

ARCHITECTURES = ("BloomForCausalLM",)
MODEL_TYPES = {"bloom": "BloomForCausalLM"}
# ALiBi's exponent range: BLOOM's slopes are `2^(−8h/P)`.
ALIBI_MAX_BIAS = 8.0


def _setting(config, keys, default):
    """The first of `keys` that `config` sets, or `BloomConfig`'s default (the released
    configs say `n_embed` and `num_attention_heads` where `BloomConfig` says `hidden_size`
    and `n_head`)."""
    return next((config[key] for key in keys if config.get(key) is not None), default)


def _sizes(config):
    """`(hidden size d, heads H, layers L)` of a BLOOM config."""
    width = int(_setting(config, ("hidden_size", "n_embed"), 64))
    heads = int(_setting(config, ("n_head", "num_attention_heads"), 8))
    layers = int(_setting(config, ("n_layer", "num_hidden_layers"), 2))
    if width % heads:
        raise ValueError(f"BLOOM's hidden size must be divisible by its heads. Received: "
                         f"hidden_size={width}, n_head={heads}")
    return width, heads, layers


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    if config.get("apply_residual_connection_post_layernorm", False):
        raise ValueError("BLOOM checkpoints with apply_residual_connection_post_layernorm=True "
                         "are not supported (keras_xf reads the pre-norm residual).")
    width, heads, layers = _sizes(config)
    epsilon = config.get("layer_norm_epsilon", 1e-5)
    block = TransformerBlock(
        MultiHeadAttention(heads, biases=[AlibiBias(max_bias=ALIBI_MAX_BIAS)]),
        FeedForward(4 * width, activation="gelu_tanh"),
        normalization="layer_norm", norm_placement="pre", epsilon=epsilon,
    )
    return CausalLM(
        vocabulary_size=config["vocab_size"], num_layers=layers, hidden_dim=width, block=block,
        max_sequence_length=int(config.get("seq_length") or 2048), position="none",
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        embedding_normalization="layer_norm", embedding_epsilon=epsilon, dtype=dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )


def _per_head(name, layers, num_heads, bias):
    """The fused `query_key_value` weight `[3d, d]` (or bias `[3d]`), whose outputs are laid
    out `[H, 3, Dh]`, ↔ the query, key and value kernels `[d, H, Dh]` (biases `[H, Dh]`)."""
    variables = [layer.bias if bias else layer.kernel for layer in layers]

    def to_model(arrays):
        fused = arrays[0] if bias else arrays[0].T  # [(d,) 3d]
        fused = fused.reshape(fused.shape[:-1] + (num_heads, 3, -1))
        return [fused[..., part, :] for part in range(3)]

    def to_checkpoint(arrays):
        fused = np.stack(arrays, axis=-2)  # [(d,) H, 3, Dh]
        fused = fused.reshape(fused.shape[:-3] + (-1,))
        return [fused if bias else fused.T]

    return Entry([name], variables, to_model, to_checkpoint)


def _block_entries(prefix, block):
    mha, ffn = block.mixer, block.feedforward
    qkv = (mha.query_dense, mha.key_dense, mha.value_dense)
    attention = f"{prefix}.self_attention"
    return (
        parts.norm(f"{prefix}.input_layernorm", block.mixer_residual.norm)
        + [_per_head(f"{attention}.query_key_value.weight", qkv, mha.num_heads, bias=False),
           _per_head(f"{attention}.query_key_value.bias", qkv, mha.num_heads, bias=True)]
        + parts.dense(f"{attention}.dense", mha.output_dense, input_axes=2)
        + parts.norm(f"{prefix}.post_attention_layernorm", block.feedforward_residual.norm)
        + parts.dense(f"{prefix}.mlp.dense_h_to_4h", ffn.hidden_dense)
        + parts.dense(f"{prefix}.mlp.dense_4h_to_h", ffn.output_dense)
    )


def tensor_map(model, config):
    backbone = model.backbone
    embeddings = backbone.embeddings
    stack = backbone.transformer_stack
    entries = ([copy("transformer.word_embeddings.weight",
                     embeddings.token_embedding.embeddings)]
               + parts.norm("transformer.word_embeddings_layernorm", embeddings.norm))
    for index, block in enumerate(stack.blocks):
        entries += _block_entries(f"transformer.h.{index}", block)
    entries += parts.norm("transformer.ln_f", stack.output_norm)
    ignored = []
    entries += parts.output_projection(backbone, ignored)
    return TensorMap(entries, ignored)


def _is_bloom_alibi(mha):
    return (len(mha.biases) == 1 and type(mha.biases[0]) is AlibiBias
            and mha.biases[0].max_bias == ALIBI_MAX_BIAS)


def hf_config(model):
    """The `BloomConfig` of `model`, or a `ValueError` naming what BLOOM cannot express."""
    backbone = model.backbone if isinstance(model, CausalLM) else None
    if backbone is None or backbone.position != "none":
        raise ValueError("BLOOM is a CausalLM with position='none' and ALiBi in its attention.")
    if backbone.embedding_normalization != "layer_norm" or backbone.embedding_scale:
        raise ValueError("BLOOM normalises its unscaled word embeddings: "
                         "embedding_normalization='layer_norm', embedding_scale=False.")
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mha, ffn = block.mixer, block.feedforward
    width = backbone.hidden_dim
    fits = (
        type(block) is TransformerBlock and parts.is_plain_attention(mha, biases=True)
        and _is_bloom_alibi(mha) and type(ffn) is FeedForward
        and block.norm_placement == "pre" and block.normalization == "layer_norm"
        and block.cross_attention is None and mha.use_bias and mha.output_bias
        and mha.num_key_value_heads == mha.num_heads
        and mha.head_dim in (None, width // mha.num_heads) and width % mha.num_heads == 0
        and ffn.activation == "gelu_tanh" and ffn.use_bias and ffn.hidden_dim == 4 * width
        and parts.has_one_template(stack)
    )
    if not fits:
        raise ValueError(
            "BLOOM needs pre-norm LayerNorm blocks of multi-head attention with biases and "
            "biases=[AlibiBias(max_bias=8)] only, and a biased tanh-GELU feedforward of width "
            "4 * hidden_dim."
        )
    if backbone.embedding_epsilon != block.epsilon:
        raise ValueError("BLOOM has one layer_norm_epsilon: embedding_epsilon must equal the "
                         f"blocks' epsilon. Received: embedding_epsilon="
                         f"{backbone.embedding_epsilon}, epsilon={block.epsilon}")
    return {
        "architectures": list(ARCHITECTURES), "model_type": "bloom",
        "vocab_size": backbone.vocabulary_size, "hidden_size": width,
        "n_layer": stack.num_layers, "n_head": mha.num_heads,
        "layer_norm_epsilon": block.epsilon, "tie_word_embeddings": backbone.tie_embeddings,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
        "attention_dropout": 0.0, "pretraining_tp": 1, "slow_but_exact": False,
        "seq_length": backbone.max_sequence_length, "pad_token_id": model.pad_token_id,
    }
