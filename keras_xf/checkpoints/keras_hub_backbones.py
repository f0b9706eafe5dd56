"""keras-hub backbones → keras_xf task models, through the loader of `from_huggingface`.

Both paths end in the family's `build` and `tensor_map`, so the name, shape and "nothing
left unused" checks of `from_huggingface` apply:
- GPT-2, Llama 3, Mistral, Qwen, Gemma: keras-hub writes the backbone as a Hugging Face
  folder with its own exporter (`keras_xf.ops.keras_internals.export_keras_hub_backbone`),
  into a temporary folder that `from_huggingface` reads.
- BERT, RoBERTa (and XLM-RoBERTa), ViT, BLOOM, Mixtral, which that exporter does not cover:
  the backbone's weights are named here as the family's Hugging Face checkpoint, in memory
  (an `ArrayCheckpoint` of NumPy arrays and a config dict). Each map is the inverse of
  keras-hub's own Hugging Face → keras-hub converter
  (`keras_hub/src/utils/transformers/convert_{bert,roberta,vit,mixtral}.py`); BLOOM, which
  has none, follows `BloomBackbone`'s layers and `transformers`' `BloomModel`.

The sub-layers of keras-hub's transformer layers are private attributes; their weights are
found by their variable paths instead (`transformer_layer_0/self_attention_layer/query/kernel`),
which keras-hub's layer names fix: `_named` looks a weight up by the end of its path, so Keras'
automatic numbering of an unnamed sub-layer (`mixtral_sparse_moe_block_3`) does not matter.
"""

import tempfile

import keras
import numpy as np

from keras_xf.checkpoints.convert import from_huggingface
from keras_xf.checkpoints.convert import load_checkpoint
from keras_xf.checkpoints.tensor_map import ArrayCheckpoint
from keras_xf.ops.keras_internals import export_keras_hub_backbone
from keras_xf.ops.keras_internals import keras_hub_exported_backbones

# keras-hub's RoBERTa drops the first `pad_token_id + 1 = 2` rows of `transformers`' position
# table (`convert_roberta._POSITION_OFFSET`): its positions count from 0.
ROBERTA_PAD_ID = 1


def _array(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable))


def _weight(variable, input_axes=1):
    """A Keras kernel whose first `input_axes` axes are its inputs (`[d, H, Dh]` queries: 1;
    `[H, Dh, d]` attention outputs: 2) → a `torch.nn.Linear` weight `[out, in]`."""
    kernel = _array(variable)
    return kernel.reshape(int(np.prod(kernel.shape[:input_axes])), -1).T


def _named(layer, name):
    """The weight of the keras-hub `layer` whose variable path ends in `/name`, or `None`
    when it has none (a layer without biases)."""
    found = [v for v in layer.weights if v.path == name or v.path.endswith(f"/{name}")]
    if len(found) > 1:
        raise ValueError(f"{len(found)} weights of the keras-hub layer {layer.name!r} end in "
                         f"{name!r}: {[v.path for v in found]}")
    return found[0] if found else None


def _weight_named(layer, name):
    """`_named`, for a weight every layer of its kind has."""
    variable = _named(layer, name)
    if variable is None:
        raise ValueError(f"The keras-hub layer {layer.name!r} has no weight named {name!r}; "
                         f"its weights: {[v.path for v in layer.weights]}")
    return variable


def _linear(tensors, prefix, kernel, bias=None, input_axes=1):
    tensors[f"{prefix}.weight"] = _weight(kernel, input_axes)
    if bias is not None:
        tensors[f"{prefix}.bias"] = _array(bias).reshape(-1)


def _dense(tensors, prefix, layer, input_axes=1):
    """A Keras `Dense` or `EinsumDense` layer → a `torch.nn.Linear`."""
    _linear(tensors, prefix, layer.kernel, layer.bias, input_axes)


def _dense_named(tensors, prefix, layer, name, input_axes=1):
    """The `Dense` or `EinsumDense` sub-layer `name` of a keras-hub `layer` (its
    `{name}/kernel` and `{name}/bias`) → a `torch.nn.Linear`."""
    _linear(tensors, prefix, _weight_named(layer, f"{name}/kernel"),
            _named(layer, f"{name}/bias"), input_axes)


def _layer_norm(tensors, prefix, layer):
    tensors[f"{prefix}.weight"] = _array(layer.gamma)
    tensors[f"{prefix}.bias"] = _array(layer.beta)


def _layer_norm_named(tensors, prefix, layer, name):
    """The `LayerNormalization` sub-layer `name` of a keras-hub `layer`."""
    tensors[f"{prefix}.weight"] = _array(_weight_named(layer, f"{name}/gamma"))
    tensors[f"{prefix}.bias"] = _array(_weight_named(layer, f"{name}/beta"))


def _encoder_layers(tensors, backbone):
    """keras-hub's post-norm `TransformerEncoder`s → `encoder.layer.{i}` of a `BertModel`
    (`convert_bert.convert_weights`, inverted)."""
    for index, layer in enumerate(backbone.transformer_layers):
        prefix = f"encoder.layer.{index}"
        for name in ("query", "key", "value"):
            _dense_named(tensors, f"{prefix}.attention.self.{name}", layer,
                         f"self_attention_layer/{name}")
        _dense_named(tensors, f"{prefix}.attention.output.dense", layer,
                     "self_attention_layer/attention_output", 2)
        _layer_norm_named(tensors, f"{prefix}.attention.output.LayerNorm", layer,
                          "self_attention_layer_norm")
        _dense_named(tensors, f"{prefix}.intermediate.dense", layer,
                     "feedforward_intermediate_dense")
        _dense_named(tensors, f"{prefix}.output.dense", layer, "feedforward_output_dense")
        _layer_norm_named(tensors, f"{prefix}.output.LayerNorm", layer,
                          "feedforward_layer_norm")


def _encoder_config(backbone, activation):
    return {
        "vocab_size": backbone.vocabulary_size, "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers, "num_attention_heads": backbone.num_heads,
        "intermediate_size": backbone.intermediate_dim, "hidden_act": activation,
        "layer_norm_eps": backbone.embeddings_layer_norm.epsilon,
        "hidden_dropout_prob": backbone.dropout, "attention_probs_dropout_prob": backbone.dropout,
        "position_embedding_type": "absolute", "is_decoder": False,
        "add_cross_attention": False,
    }


def _bert(backbone):
    """`BertBackbone` → a `BertModel` with its pooler (`pooled_dense`). keras-hub's BERT
    uses the tanh GELU (`gelu_approximate`), `transformers`' `"gelu_new"`."""
    tensors = {
        "embeddings.word_embeddings.weight": _array(backbone.token_embedding.embeddings),
        "embeddings.position_embeddings.weight":
            _array(backbone.position_embedding.position_embeddings),
        "embeddings.token_type_embeddings.weight": _array(backbone.segment_embedding.embeddings),
    }
    _layer_norm(tensors, "embeddings.LayerNorm", backbone.embeddings_layer_norm)
    _encoder_layers(tensors, backbone)
    _dense(tensors, "pooler.dense", backbone.pooled_dense)
    config = {**_encoder_config(backbone, "gelu_new"), "architectures": ["BertModel"],
              "model_type": "bert", "pad_token_id": 0,
              "max_position_embeddings": backbone.max_sequence_length,
              "type_vocab_size": backbone.num_segments}
    return config, tensors


def _roberta(backbone):
    """`RobertaBackbone` (and `XLMRobertaBackbone`) → a `RobertaModel` without pooler: the
    position table gets back the two rows before `pad_token_id + 1` (never read for right-
    padded batches) and the one token-type row, which keras-hub does not have, is zero."""
    width = backbone.hidden_dim
    table = _array(backbone.embeddings.position_embedding.position_embeddings)
    offset = ROBERTA_PAD_ID + 1
    tensors = {
        "embeddings.word_embeddings.weight": _array(backbone.token_embedding.embeddings),
        "embeddings.position_embeddings.weight":
            np.concatenate([np.zeros((offset, width), table.dtype), table]),
        "embeddings.token_type_embeddings.weight": np.zeros((1, width), table.dtype),
    }
    _layer_norm(tensors, "embeddings.LayerNorm", backbone.embeddings_layer_norm)
    _encoder_layers(tensors, backbone)
    config = {**_encoder_config(backbone, "gelu"), "architectures": ["RobertaModel"],
              "model_type": "roberta", "pad_token_id": ROBERTA_PAD_ID, "bos_token_id": 0,
              "eos_token_id": 2, "max_position_embeddings": backbone.max_sequence_length + offset,
              "type_vocab_size": 1}
    return config, tensors


def _vit(backbone):
    """`ViTBackbone` → a `ViTModel` without pooler (`convert_vit.convert_weights`,
    inverted): keras-hub's backbone has no classifier, and its output is the normalised
    sequence, `last_hidden_state`."""
    data_format = backbone.data_format
    height, width, channels = (backbone.image_shape if data_format == "channels_last"
                               else tuple(backbone.image_shape[i] for i in (1, 2, 0)))
    patch = tuple(backbone.patch_size)
    refused = {
        "square images": height == width, "square patches": patch[0] == patch[1],
        "use_class_token=True": backbone.use_class_token,
        "use_mha_bias=True": backbone.use_mha_bias, "use_mlp_bias=True": backbone.use_mlp_bias,
        "use_patch_bias=True": backbone.use_patch_bias,
    }
    missing = [k for k, ok in refused.items() if not ok]
    if missing:
        raise ValueError(f"A ViTBackbone converts with {', '.join(missing)} (a ViTModel "
                         f"checkpoint has them). Received: image_shape={backbone.image_shape},"
                         f" patch_size={backbone.patch_size}, use_class_token="
                         f"{backbone.use_class_token}, use_mha_bias={backbone.use_mha_bias}, "
                         f"use_mlp_bias={backbone.use_mlp_bias}, use_patch_bias="
                         f"{backbone.use_patch_bias}")
    embedding = backbone.get_layer("vit_patching_and_embedding")
    encoder = backbone.get_layer("vit_encoder")
    tensors = {
        "embeddings.cls_token": _array(embedding.class_token),
        "embeddings.position_embeddings": _array(embedding.position_embedding.embeddings)[None],
        # Conv2D kernel [P, P, C, d] → Conv2d weight [d, C, P, P].
        "embeddings.patch_embeddings.projection.weight":
            np.transpose(_array(embedding.patch_embedding.kernel), (3, 2, 0, 1)),
        "embeddings.patch_embeddings.projection.bias": _array(embedding.patch_embedding.bias),
    }
    for index, block in enumerate(encoder.encoder_layers):
        prefix = f"encoder.layer.{index}"
        for name in ("query", "key", "value"):
            _dense(tensors, f"{prefix}.attention.attention.{name}",
                   getattr(block.mha, f"{name}_dense"))
        _dense(tensors, f"{prefix}.attention.output.dense", block.mha.output_dense, 2)
        _layer_norm(tensors, f"{prefix}.layernorm_before", block.layer_norm_1)
        _layer_norm(tensors, f"{prefix}.layernorm_after", block.layer_norm_2)
        _dense(tensors, f"{prefix}.intermediate.dense", block.mlp.dense_1)
        _dense(tensors, f"{prefix}.output.dense", block.mlp.dense_2)
    _layer_norm(tensors, "layernorm", encoder.layer_norm)
    config = {
        "architectures": ["ViTModel"], "model_type": "vit", "image_size": height,
        "patch_size": patch[0], "num_channels": channels, "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers, "num_attention_heads": backbone.num_heads,
        "intermediate_size": backbone.mlp_dim, "hidden_act": "gelu",
        "layer_norm_eps": backbone.layer_norm_epsilon, "qkv_bias": True,
        "hidden_dropout_prob": backbone.dropout_rate,
        "attention_probs_dropout_prob": backbone.attention_dropout,
    }
    return config, tensors


def _bloom(backbone):
    """`BloomBackbone` → a `BloomForCausalLM` with tied embeddings (keras-hub's are): its
    separate query, key and value kernels `[d, H, Dh]` fused into `query_key_value`, whose
    outputs are laid out `[H, 3, Dh]`."""
    width = backbone.hidden_dim
    if backbone.intermediate_dim != 4 * width:
        raise ValueError("BLOOM's feedforward is 4 * hidden_dim wide. Received: "
                         f"intermediate_dim={backbone.intermediate_dim}, hidden_dim={width}")
    tensors = {"transformer.word_embeddings.weight": _array(backbone.token_embedding.embeddings)}
    _layer_norm(tensors, "transformer.word_embeddings_layernorm",
                backbone.embeddings_layer_norm)
    for index, layer in enumerate(backbone.transformer_layers):
        prefix = f"transformer.h.{index}"
        parts = [f"self_attention/{name}_dense" for name in ("query", "key", "value")]
        kernel = np.stack([_array(_weight_named(layer, f"{p}/kernel")) for p in parts],
                          axis=2)  # [d, H, 3, Dh]
        bias = np.stack([_array(_weight_named(layer, f"{p}/bias")) for p in parts],
                        axis=1)  # [H, 3, Dh]
        tensors[f"{prefix}.self_attention.query_key_value.weight"] = kernel.reshape(width, -1).T
        tensors[f"{prefix}.self_attention.query_key_value.bias"] = bias.reshape(-1)
        _dense_named(tensors, f"{prefix}.self_attention.dense", layer,
                     "self_attention/output_dense")
        _layer_norm_named(tensors, f"{prefix}.input_layernorm", layer, "pre_attention_layernorm")
        _layer_norm_named(tensors, f"{prefix}.post_attention_layernorm", layer,
                          "post_attention_layernorm")
        _dense_named(tensors, f"{prefix}.mlp.dense_h_to_4h", layer, "mlp_intermediate_dense")
        _dense_named(tensors, f"{prefix}.mlp.dense_4h_to_h", layer, "mlp_output_dense")
    _layer_norm(tensors, "transformer.ln_f", backbone.layer_norm)
    config = {
        "architectures": ["BloomForCausalLM"], "model_type": "bloom",
        "vocab_size": backbone.vocabulary_size, "hidden_size": width,
        "n_layer": backbone.num_layers, "n_head": backbone.num_heads,
        "layer_norm_epsilon": backbone.layer_norm_epsilon, "tie_word_embeddings": True,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": backbone.dropout,
        "attention_dropout": backbone.dropout, "pretraining_tp": 1, "slow_but_exact": False,
        "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2,
    }
    return config, tensors


def _mixtral(backbone):
    """`MixtralBackbone` → a `MixtralForCausalLM` with its own `lm_head`
    (`convert_mixtral.convert_weights`, inverted). keras-hub adds the load-balancing loss
    whenever it trains, so the config sets `output_router_logits`."""
    embedding = backbone.token_embedding
    tensors = {"model.embed_tokens.weight": _array(embedding.embeddings),
               "lm_head.weight": _array(embedding.reverse_embeddings).T}
    for index, layer in enumerate(backbone.transformer_layers):
        prefix = f"model.layers.{index}"
        for name, keras_name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            _dense_named(tensors, f"{prefix}.self_attn.{name}", layer,
                         f"self_attention/{keras_name}")
        _dense_named(tensors, f"{prefix}.self_attn.o_proj", layer,
                     "self_attention/attention_output", 2)
        tensors[f"{prefix}.input_layernorm.weight"] = _array(
            _weight_named(layer, "self_attention_layernorm/scale"))
        tensors[f"{prefix}.post_attention_layernorm.weight"] = _array(
            _weight_named(layer, "feedforward_layernorm/scale"))
        moe_prefix = f"{prefix}.block_sparse_moe"
        _dense_named(tensors, f"{moe_prefix}.gate", layer, "sparse_feedforward_gate_dense")
        for weight, name in (("w1", "gate"), ("w3", "intermediate"), ("w2", "output")):
            bank = _weight_named(layer, f"experts/expert_feedforward_{name}_dense")
            for expert, kernel in enumerate(_array(bank)):  # [in, out] each
                tensors[f"{moe_prefix}.experts.{expert}.{weight}.weight"] = kernel.T
    tensors["model.norm.weight"] = _array(backbone.layer_norm.scale)
    rope = {"rope_type": "default", "rope_theta": float(backbone.rope_max_wavelength)}
    if backbone.rope_scaling_factor != 1.0:
        rope.update(rope_type="linear", factor=float(backbone.rope_scaling_factor))
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "vocab_size": backbone.vocabulary_size, "hidden_size": backbone.hidden_dim,
        "intermediate_size": backbone.intermediate_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_query_heads,
        "num_key_value_heads": backbone.num_key_value_heads,
        "head_dim": backbone.hidden_dim // backbone.num_query_heads,
        "num_local_experts": backbone.num_experts, "num_experts_per_tok": backbone.top_k,
        "rms_norm_eps": backbone.layer_norm_epsilon, "rope_parameters": rope,
        "sliding_window": backbone.sliding_window, "hidden_act": "silu",
        # Mixtral 8x7B's context; keras-hub's backbone does not hold one.
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "output_router_logits": True, "router_aux_loss_coef": backbone.router_aux_loss_coef,
        "router_jitter_noise": backbone.router_jitter_noise,
        "attention_dropout": backbone.dropout,
    }
    return config, tensors


def _converters():
    """`{keras-hub backbone class: its map}` (subclasses, XLM-RoBERTa's, included)."""
    import keras_hub

    models = keras_hub.models
    return {models.BertBackbone: _bert, models.RobertaBackbone: _roberta,
            models.ViTBackbone: _vit, models.BloomBackbone: _bloom,
            models.MixtralBackbone: _mixtral}


def from_keras_hub(backbone, dtype=None):
    """The keras_xf task model with the weights of an in-memory keras-hub backbone.

    Args:
        backbone: a keras-hub backbone: one that keras-hub's Hugging Face exporter writes
            (`GPT2Backbone`, `Llama3Backbone`, `MistralBackbone`, `QwenBackbone`,
            `GemmaBackbone`, ...), or a `BertBackbone`, `RobertaBackbone`,
            `XLMRobertaBackbone`, `ViTBackbone`, `BloomBackbone` or `MixtralBackbone`.
        dtype: the dtype policy of the keras_xf model (see `from_huggingface`).

    Returns:
        The model `from_huggingface` returns for the equivalent checkpoint: a `CausalLM`
        (the decoders, BLOOM, Mixtral), a `TextEncoder` (BERT: its output is the pooler's,
        `pooled_output`; RoBERTa has no pooler: the `[CLS]` state; `model.backbone` gives
        `sequence_output`) or a `VisionBackbone` (ViT: keras-hub's backbone has no
        classifier; its output is the backbone's, channels-last images in).

    Raises:
        ValueError: a backbone of another class, or a setting the family's checkpoint
            cannot express (a BLOOM feedforward not 4 * hidden_dim wide, a ViT without
            biases or with non-square images).

    Example:
    >>> backbone = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=1,
    ...     num_heads=2, hidden_dim=16, intermediate_dim=32)  # or .from_preset(name)
    >>> encoder = from_keras_hub(backbone)
    """
    try:
        exported = keras_hub_exported_backbones()
    except ImportError:
        raise ImportError("Converting keras-hub backbones needs keras-hub with its Hugging "
                          "Face exporter: pip install 'keras-hub>=0.20'") from None
    name = type(backbone).__name__
    if type(backbone) in exported:  # the exporter's table is keyed by the exact class
        with tempfile.TemporaryDirectory() as directory:
            export_keras_hub_backbone(backbone, directory)
            return from_huggingface(directory, dtype=dtype)
    converters = _converters()
    convert = next((f for cls, f in converters.items() if isinstance(backbone, cls)), None)
    if convert is None:
        known = sorted({cls.__name__ for cls in exported} | {cls.__name__ for cls in converters})
        raise ValueError(f"backbone must be one of the keras-hub backbones keras_xf converts "
                         f"({known}). Received: a {name}")
    config, tensors = convert(backbone)
    return load_checkpoint(ArrayCheckpoint(config, tensors, f"<keras-hub {name}>"), dtype=dtype)
