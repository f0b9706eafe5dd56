"""GPT-2 (`GPT2LMHeadModel`) ↔ a pre-norm `CausalLM` with learned positions.

GPT-2 stores its projections as `Conv1D` weights `[in, out]` and fuses the query, key and
value projections into one `c_attn` tensor `[d, 3d]`.
"""

import numpy as np

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.checkpoints.tensor_map import split

ARCHITECTURES = ("GPT2LMHeadModel",)
MODEL_TYPES = {"gpt2": "GPT2LMHeadModel"}


def _check(config):
    unsupported = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                   "scale_attn_weights": True, "add_cross_attention": False}
    for key, value in unsupported.items():
        if config.get(key, value) != value:
            raise ValueError(f"GPT2 checkpoints with {key}={config[key]!r} are not supported "
                             f"(keras_xf reads {key}={value!r}).")


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    _check(config)
    width = config["n_embd"]
    block = TransformerBlock(
        MultiHeadAttention(config["n_head"]),
        FeedForward(config.get("n_inner") or 4 * width,
                    activation=parts.activation(config, "activation_function")),
        normalization="layer_norm", norm_placement="pre",
        epsilon=config.get("layer_norm_epsilon", 1e-5),
    )
    return CausalLM(
        vocabulary_size=config["vocab_size"], num_layers=config["n_layer"], hidden_dim=width,
        block=block, max_sequence_length=config["n_positions"], position="learned",
        tie_embeddings=config.get("tie_word_embeddings", True), dtype=dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )


def _conv1d(name, variable, input_axes=1):
    """A `Conv1D` weight `[in, out]` ↔ a kernel whose first `input_axes` axes are inputs."""
    shape = tuple(variable.shape)
    inputs = int(np.prod(shape[:input_axes]))
    return Entry([name], [variable], lambda a: [a[0].reshape(shape)],
                 lambda a: [a[0].reshape(inputs, -1)])


def _block_entries(prefix, block):
    mha, ffn = block.mixer, block.feedforward
    qkv = (mha.query_dense, mha.key_dense, mha.value_dense)
    kernel_shapes = [tuple(d.kernel.shape) for d in qkv]
    bias_shapes = [tuple(d.bias.shape) for d in qkv]
    width = kernel_shapes[0][0]
    return (
        parts.norm(f"{prefix}.ln_1", block.mixer_residual.norm)
        + [split(f"{prefix}.attn.c_attn.weight", [d.kernel for d in qkv], axis=1,
                 to_model_each=[lambda a, s=s: a.reshape(s) for s in kernel_shapes],
                 to_checkpoint_each=[lambda a: a.reshape(width, -1)] * 3),
           split(f"{prefix}.attn.c_attn.bias", [d.bias for d in qkv], axis=0,
                 to_model_each=[lambda a, s=s: a.reshape(s) for s in bias_shapes],
                 to_checkpoint_each=[lambda a: a.reshape(-1)] * 3),
           _conv1d(f"{prefix}.attn.c_proj.weight", mha.output_dense.kernel, input_axes=2),
           copy(f"{prefix}.attn.c_proj.bias", mha.output_dense.bias)]
        + parts.norm(f"{prefix}.ln_2", block.feedforward_residual.norm)
        + [_conv1d(f"{prefix}.mlp.c_fc.weight", ffn.hidden_dense.kernel),
           copy(f"{prefix}.mlp.c_fc.bias", ffn.hidden_dense.bias),
           _conv1d(f"{prefix}.mlp.c_proj.weight", ffn.output_dense.kernel),
           copy(f"{prefix}.mlp.c_proj.bias", ffn.output_dense.bias)]
    )


def tensor_map(model, config):
    backbone = model.backbone
    stack = backbone.transformer_stack
    entries = [copy("transformer.wte.weight", backbone.embeddings.token_embedding.embeddings),
               copy("transformer.wpe.weight",
                    backbone.embeddings.position_embedding.position_embeddings)]
    for index, block in enumerate(stack.blocks):
        entries += _block_entries(f"transformer.h.{index}", block)
    entries += parts.norm("transformer.ln_f", stack.output_norm)
    # The causal-mask buffers of older checkpoints; the output projection tied to `wte`.
    ignored = [r"transformer\.h\.\d+\.attn\.(masked_)?bias"]
    entries += parts.output_projection(backbone, ignored)
    return TensorMap(entries, ignored)


def hf_config(model):
    """The `GPT2Config` of `model`, or a `ValueError` naming what GPT-2 cannot express."""
    backbone = model.backbone if isinstance(model, CausalLM) else None
    if backbone is None or backbone.position != "learned":
        raise ValueError("GPT-2 is a CausalLM with position='learned'.")
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mha, ffn = block.mixer, block.feedforward
    fits = (
        type(block) is TransformerBlock and parts.is_plain_attention(mha)
        and type(ffn) is FeedForward and block.norm_placement == "pre"
        and block.normalization == "layer_norm" and block.cross_attention is None
        and mha.use_bias and ffn.use_bias and mha.num_key_value_heads == mha.num_heads
        and mha.head_dim in (None, backbone.hidden_dim // mha.num_heads)
        and ffn.activation in parts.HF_ACTIVATIONS and not backbone.embedding_scale
        and backbone.embedding_normalization is None
        and parts.has_one_template(stack)
    )
    if not fits:
        raise ValueError("GPT-2 needs pre-norm LayerNorm blocks of plain multi-head attention "
                         "with biases and an ungated biased feedforward.")
    width = backbone.hidden_dim
    return {
        "architectures": list(ARCHITECTURES), "model_type": "gpt2",
        "vocab_size": backbone.vocabulary_size, "n_positions": backbone.max_sequence_length,
        "n_embd": width, "n_layer": stack.num_layers, "n_head": mha.num_heads,
        "n_inner": ffn.hidden_dim, "activation_function": parts.HF_ACTIVATIONS[ffn.activation],
        "layer_norm_epsilon": block.epsilon, "tie_word_embeddings": backbone.tie_embeddings,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "pad_token_id": model.pad_token_id,
    }
