"""ViT (`ViTForImageClassification`) ↔ a pre-norm `VisionClassifier` with a `[CLS]` token
that has a position of its own; the encoder alone (`ViTModel` saved without pooler, names
without `vit.`) ↔ its `VisionBackbone`, whose output is `last_hidden_state`.

The checkpoint's patch projection is a `Conv2d` weight `[d, C, P, P]`; keras_xf's
`PatchEmbedding` flattens each patch as `(row, column, channel)` into a `[P·P·C, d]` kernel.
Its position table `[1, N + 1, d]` holds the `[CLS]` token's position in row 0.
"""

import numpy as np

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.models.backbones.vision_backbone import VisionBackbone
from keras_xf.models.encoders.vision_classifier import VisionClassifier

ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
MODEL_TYPES = {"vit": "ViTForImageClassification"}


def _is_base(config):
    """A `ViTModel` (the encoder alone, names without `vit.`), not a classifier."""
    return "ViTModel" in (config.get("architectures") or [])


def build_from_folder(folder, dtype=None):
    """`build`, refusing a `ViTModel` saved with its pooler (keras_xf's `VisionBackbone`
    returns `last_hidden_state` and has no place for `pooler.dense`)."""
    if _is_base(folder.config) and any(n.startswith("pooler.") for n in folder.keys()):
        raise ValueError(
            f"The ViTModel checkpoint in {folder.directory} has a pooler (pooler.dense), "
            "which keras_xf's VisionBackbone has no place for. Save the encoder without it "
            "(ViTModel(config, add_pooling_layer=False)) or as a ViTForImageClassification."
        )
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    """The `VisionClassifier` of a `ViTForImageClassification` config, or the
    `VisionBackbone` (its output `last_hidden_state`) of a `ViTModel` one."""
    size, patch = config["image_size"], config["patch_size"]
    block = TransformerBlock(
        MultiHeadAttention(config["num_attention_heads"], use_bias=config.get("qkv_bias", True),
                           output_bias=True),
        FeedForward(config["intermediate_size"], activation=parts.activation(config, "hidden_act")),
        normalization="layer_norm", norm_placement="pre",
        epsilon=config.get("layer_norm_eps", 1e-12),
    )
    backbone = VisionBackbone(
        image_shape=(size, size, config.get("num_channels", 3)), patch_size=patch,
        num_layers=config["num_hidden_layers"], hidden_dim=config["hidden_size"], block=block,
        positions="learned", class_token=True, class_token_position=True, dtype=dtype,
    )
    if _is_base(config):
        return backbone
    labels = config.get("id2label") or {}
    return VisionClassifier(num_classes=config.get("num_labels") or len(labels) or 2,
                            backbone=backbone, pooling="cls", dtype=dtype)


def _patch_kernel(name, variable, patch, channels):
    width = variable.shape[-1]
    return Entry(
        [name], [variable],
        lambda a: [np.transpose(a[0], (2, 3, 1, 0)).reshape(patch * patch * channels, width)],
        lambda a: [np.transpose(a[0].reshape(patch, patch, channels, width), (3, 2, 0, 1))],
    )


def _positions(name, class_token, table):
    """`[1, N + 1, d]` ↔ the `[CLS]` position `[1, 1, d]` and the patch table `[N, d]`."""
    return Entry([name], [class_token.position_embedding, table],
                 lambda a: [a[0][:, :1], a[0][0, 1:]],
                 lambda a: [np.concatenate([a[0], a[1][None]], axis=1)])


def _block_entries(prefix, block):
    mha, ffn = block.mixer, block.feedforward
    attention = f"{prefix}.attention.attention"
    return (
        parts.norm(f"{prefix}.layernorm_before", block.mixer_residual.norm)
        + parts.dense(f"{attention}.query", mha.query_dense)
        + parts.dense(f"{attention}.key", mha.key_dense)
        + parts.dense(f"{attention}.value", mha.value_dense)
        + parts.dense(f"{prefix}.attention.output.dense", mha.output_dense, input_axes=2)
        + parts.norm(f"{prefix}.layernorm_after", block.feedforward_residual.norm)
        + parts.dense(f"{prefix}.intermediate.dense", ffn.hidden_dense)
        + parts.dense(f"{prefix}.output.dense", ffn.output_dense)
    )


def tensor_map(model, config):
    """The names of a `VisionClassifier`'s variables (`vit.…`, `classifier`) or of a
    `VisionBackbone`'s (a `ViTModel`'s, without the `vit.` prefix)."""
    classifier = isinstance(model, VisionClassifier)
    backbone = model.backbone if classifier else model
    prefix = "vit." if classifier else ""
    embedding = backbone.patch_embedding
    entries = [
        copy(f"{prefix}embeddings.cls_token", backbone.class_token.token),
        _positions(f"{prefix}embeddings.position_embeddings", backbone.class_token,
                   backbone.position_embedding.position_embeddings),
        _patch_kernel(f"{prefix}embeddings.patch_embeddings.projection.weight",
                      embedding.projection.kernel, backbone.patch_size, backbone.image_shape[-1]),
        copy(f"{prefix}embeddings.patch_embeddings.projection.bias", embedding.projection.bias),
    ]
    for index, block in enumerate(backbone.transformer_stack.blocks):
        entries += _block_entries(f"{prefix}encoder.layer.{index}", block)
    entries += parts.norm(f"{prefix}layernorm", backbone.transformer_stack.output_norm)
    if classifier:
        entries += parts.dense("classifier", model.head.output_dense)
    return TensorMap(entries)


def hf_config(model):
    """The `ViTConfig` of `model` (a `VisionClassifier`, or a `VisionBackbone` written as a
    `ViTModel` without pooler), or a `ValueError` naming what ViT cannot express."""
    classifier = isinstance(model, VisionClassifier)
    if not classifier and not isinstance(model, VisionBackbone):
        raise ValueError("ViT is a VisionClassifier or a VisionBackbone.")
    backbone = model.backbone if classifier else model
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mha, ffn = block.mixer, block.feedforward
    height, width, channels = backbone.image_shape
    fits = (
        backbone.positions == "learned" and backbone.use_class_token
        and backbone.class_token_position and height == width
        and (not classifier or (model.pooling_mode == "cls" and model.head.hidden_dense is None))
        and type(block) is TransformerBlock and parts.is_plain_attention(mha)
        and mha.output_bias and mha.num_key_value_heads == mha.num_heads
        and type(ffn) is FeedForward and ffn.use_bias and ffn.activation in ("gelu", "gelu_tanh")
        and block.norm_placement == "pre" and block.normalization == "layer_norm"
        and parts.has_one_template(stack)
    )
    if not fits:
        raise ValueError("ViT needs square images, learned positions, a [CLS] token with its "
                         "own position (pooled by 'cls' into a one-layer head in a "
                         "classifier), and pre-norm LayerNorm blocks of plain attention and a "
                         "GELU feedforward.")
    config = {
        "architectures": ["ViTForImageClassification" if classifier else "ViTModel"],
        "model_type": "vit",
        "hidden_size": backbone.hidden_dim, "num_hidden_layers": stack.num_layers,
        "num_attention_heads": mha.num_heads, "intermediate_size": ffn.hidden_dim,
        "hidden_act": parts.HF_ACTIVATIONS[ffn.activation], "layer_norm_eps": block.epsilon,
        "image_size": height, "patch_size": backbone.patch_size, "num_channels": channels,
        "qkv_bias": mha.use_bias, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if classifier:
        classes = model.head.output_dense.units
        config.update(id2label={str(i): f"LABEL_{i}" for i in range(classes)},
                      label2id={f"LABEL_{i}": i for i in range(classes)})
    return config
