"""BERT and RoBERTa (`BertModel`, `RobertaModel`, `XLMRobertaModel`) ↔ a `TextEncoder`
whose head is BERT's pooler.

Both are post-norm encoders (survey §2.4, `LNorm(F(x) + x)`) with exact-GELU feedforwards,
biased attention projections, learned positions, segment (token-type) embeddings and a
LayerNorm of the summed embeddings (survey §6). The `TextEncoder` head is the pooler,
`tanh(W · h_0 + b)` of the first token, so the encoder's output is `pooler_output` and its
backbone's output is `last_hidden_state`. A checkpoint saved without pooler
(`add_pooling_layer=False`) gives a `TextEncoder` without projection, whose output is the
first token's state `h_0`. Older writers' names (a `bert.` / `roberta.` prefix,
`LayerNorm.gamma` / `.beta`) are read as today's (`current_name`).

RoBERTa differs only in its positions: `transformers` numbers the real tokens from
`pad_token_id + 1` (non-pad tokens counted in order), which for right-padded batches is
`position_offset = pad_token_id + 1`. Its single token-type row is `num_segments=1`: the
row is added to every token and the model takes no `segment_ids` input.
"""

import re

import numpy as np

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.models.encoders.text_encoder import TextEncoder
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone

ARCHITECTURES = ("BertModel", "RobertaModel", "XLMRobertaModel")
MODEL_TYPES = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}
_HEADS = ("keras_xf has no masked-language-model task whose head (a dense + GELU + LayerNorm "
          "transform, then the tied decoder with its own bias) takes these tensors. Save the "
          "encoder alone (`model.{prefix}.save_pretrained(...)`, a {base}) and load that.")
# Checkpoints of these architectures are refused with the reason.
REFUSED = {
    "BertForMaskedLM": _HEADS.format(prefix="bert", base="BertModel"),
    "BertForPreTraining": _HEADS.format(prefix="bert", base="BertModel"),
    "RobertaForMaskedLM": _HEADS.format(prefix="roberta", base="RobertaModel"),
    "XLMRobertaForMaskedLM": _HEADS.format(prefix="roberta", base="XLMRobertaModel"),
}


def _check(config):
    expected = {"position_embedding_type": "absolute", "is_decoder": False,
                "add_cross_attention": False}
    for key, value in expected.items():
        if config.get(key, value) != value:
            raise ValueError(f"{config.get('model_type')} checkpoints with {key}="
                             f"{config[key]!r} are not supported (keras_xf reads {key}={value!r}).")


def _position_offset(config):
    if config.get("model_type") in ("roberta", "xlm-roberta"):
        return config.get("pad_token_id", 1) + 1
    return 0


def current_name(name):
    """A checkpoint tensor's name as `BertModel` writes it today: without the base-model
    prefix (`bert.`, `roberta.`) that a `BertForPreTraining`-style model saves its encoder
    under, and with TensorFlow-era `LayerNorm.gamma` / `LayerNorm.beta` as `.weight` /
    `.bias`."""
    for prefix in ("bert.", "roberta."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)


def build_from_folder(folder, dtype=None):
    """`build`, with BERT's pooler when the checkpoint has one (a `BertModel` saved with
    `add_pooling_layer=False` has none: its `TextEncoder` outputs the `[CLS]` state)."""
    names = {current_name(name) for name in folder.keys()}
    pooler = any(name.startswith("pooler.") for name in names)
    return build(folder.config, dtype=dtype, pooler=pooler)


def build(config, dtype=None, pooler=True):
    """The `TextEncoder` of a BERT, RoBERTa or XLM-RoBERTa config (a `config.json` dict),
    with BERT's pooler as its projection when `pooler`, else outputting the `[CLS]` state."""
    _check(config)
    width = config["hidden_size"]
    epsilon = config.get("layer_norm_eps", 1e-12)
    block = TransformerBlock(
        MultiHeadAttention(config["num_attention_heads"]),
        FeedForward(config["intermediate_size"],
                    activation=parts.activation(config, "hidden_act")),
        normalization="layer_norm", norm_placement="post", epsilon=epsilon,
    )
    backbone = TransformerBackbone(
        vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        hidden_dim=width, block=block, max_sequence_length=config["max_position_embeddings"],
        position="learned", num_segments=config.get("type_vocab_size", 2),
        embedding_normalization="layer_norm", embedding_epsilon=epsilon,
        position_offset=_position_offset(config), dtype=dtype,
    )
    if not pooler:
        return TextEncoder(backbone, pooling="cls", normalize=False, dtype=dtype)
    return TextEncoder(backbone, pooling="cls", projection_dim=width,
                       projection_activation="tanh", normalize=False, dtype=dtype)


def _zeros(name, shape, like):
    """A tensor written as zeros (no token types: one zero row), from no variable."""
    def to_model(arrays):
        raise ValueError(f"{name} is written, not read, for a model without num_segments.")
    return Entry([name], [like], to_model, lambda a: [np.zeros(shape, a[0].dtype)])


def _block_entries(prefix, block):
    mha, ffn = block.mixer, block.feedforward
    names = ("self.query", "self.key", "self.value", "output.dense")
    return (parts.attention(f"{prefix}.attention", mha, names)
            + parts.norm(f"{prefix}.attention.output.LayerNorm", block.mixer_residual.norm)
            + parts.dense(f"{prefix}.intermediate.dense", ffn.hidden_dense)
            + parts.dense(f"{prefix}.output.dense", ffn.output_dense)
            + parts.norm(f"{prefix}.output.LayerNorm", block.feedforward_residual.norm))


def tensor_map(model, config):
    """The checkpoint names of a `TextEncoder`'s (or a backbone's) variables."""
    backbone = model.backbone if isinstance(model, TextEncoder) else model
    embeddings = backbone.embeddings
    entries = [
        copy("embeddings.word_embeddings.weight", embeddings.token_embedding.embeddings),
        copy("embeddings.position_embeddings.weight",
             embeddings.position_embedding.position_embeddings),
    ]
    if embeddings.segment_embedding is not None:
        entries.append(copy("embeddings.token_type_embeddings.weight",
                            embeddings.segment_embedding.embeddings))
    else:
        entries.append(_zeros("embeddings.token_type_embeddings.weight",
                              (1, backbone.hidden_dim), embeddings.norm.gamma))
    entries += parts.norm("embeddings.LayerNorm", embeddings.norm)
    for index, block in enumerate(backbone.transformer_stack.blocks):
        entries += _block_entries(f"encoder.layer.{index}", block)
    if isinstance(model, TextEncoder) and model.projection is not None:
        entries += parts.dense("pooler.dense", model.projection)
    # The position-id buffer that older checkpoints saved.
    return TensorMap(entries, ignored=[r"embeddings\.position_ids"], alias=current_name)


def _fits(backbone):
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mha, ffn = block.mixer, block.feedforward
    return (
        not backbone.causal and backbone.position == "learned" and not backbone.embedding_scale
        and backbone.embedding_normalization == "layer_norm"
        and type(block) is TransformerBlock and block.norm_placement == "post"
        and block.normalization == "layer_norm" and block.cross_attention is None
        and backbone.embedding_epsilon == block.epsilon and stack.output_norm is None
        and parts.is_plain_attention(mha) and mha.use_bias and mha.output_bias
        and mha.num_key_value_heads == mha.num_heads
        and mha.head_dim in (None, backbone.hidden_dim // mha.num_heads)
        and type(ffn) is FeedForward and ffn.use_bias and ffn.activation in parts.HF_ACTIVATIONS
        and ffn.output_dim in (None, backbone.hidden_dim)
        and parts.has_one_template(stack) and stack.share_attention_maps == 1
    )


def _check_head(model):
    """A `TextEncoder`'s projection must be BERT's pooler to be written (the pooling itself is
    keras_xf's: `transformers` returns the hidden states it pools)."""
    if model.projection is None:
        return
    if not (model.pooling_mode == "cls" and model.projection_activation == "tanh"
            and model.projection_dim == model.backbone.hidden_dim and not model.normalize):
        raise ValueError(
            "BERT's pooler is TextEncoder(pooling='cls', projection_dim=hidden_dim, "
            "projection_activation='tanh', normalize=False); this TextEncoder's projection "
            "has no place in a BertModel checkpoint. Received: "
            f"pooling={model.pooling_mode!r}, projection_dim={model.projection_dim}, "
            f"projection_activation={model.projection_activation!r}, "
            f"normalize={model.normalize}"
        )


def hf_config(model):
    """The `BertConfig` (`position_offset=0`) or `RobertaConfig` (`pad_token_id =
    position_offset - 1`) of a `TextEncoder` or non-causal `TransformerBackbone`, or a
    `ValueError` naming what BERT cannot express."""
    if isinstance(model, TextEncoder):
        backbone = model.backbone
        _check_head(model)
    elif isinstance(model, TransformerBackbone):
        backbone = model
    else:
        raise ValueError("BERT and RoBERTa are a TextEncoder or a non-causal TransformerBackbone.")
    if not _fits(backbone):
        raise ValueError(
            "BERT needs a non-causal encoder with learned positions, a LayerNorm of the "
            "embeddings with the blocks' epsilon, and post-norm LayerNorm blocks of plain "
            "biased multi-head attention and an ungated biased feedforward."
        )
    block = backbone.transformer_stack.blocks[0]
    mha, ffn = block.mixer, block.feedforward
    offset = backbone.position_offset
    config = {
        "vocab_size": backbone.vocabulary_size, "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers, "num_attention_heads": mha.num_heads,
        "intermediate_size": ffn.hidden_dim,
        "hidden_act": parts.HF_ACTIVATIONS[ffn.activation],
        "hidden_dropout_prob": block.dropout, "attention_probs_dropout_prob": mha.dropout,
        "max_position_embeddings": backbone.max_sequence_length,
        "type_vocab_size": backbone.num_segments or 1, "layer_norm_eps": block.epsilon,
        "position_embedding_type": "absolute", "is_decoder": False,
        "add_cross_attention": False,
    }
    if offset == 0:
        config.update(architectures=["BertModel"], model_type="bert", pad_token_id=0)
    else:
        config.update(architectures=["RobertaModel"], model_type="roberta",
                      pad_token_id=offset - 1, bos_token_id=0, eos_token_id=2)
    return config
