"""Mamba (`MambaForCausalLM`) ↔ a `CausalLM` of pre-norm RMSNorm blocks of a `MambaMixer`
without a feedforward.

What Mamba computes, and the general options of the layers and models that express it:
- No position embedding (`position="none"`): the causal convolution and the state carry
  the order.
- Each block is `h + Mixer(RMSNorm(h))` (`MambaBlock`), with no feedforward:
  `TransformerBlock(MambaMixer(...), None, normalization="rms_norm", norm_placement="pre")`;
  a final RMSNorm (`norm_f`, the stack's output norm); the output projection tied to the
  embeddings unless `tie_word_embeddings=False`.
- The mixer (`MambaMixer`): `in_proj` `d → 2E` (`E = expand · d`), a causal depthwise
  `conv1d` of `conv_kernel` taps and SiLU, `x_proj` `E → R + 2N` (the low-rank step input
  and the selective `B`, `C`), `dt_proj` `R → E` and softplus, `A = −exp(A_log)`, Mamba's
  discretisation (`Ā = exp(ΔA)`, `B̄ = ΔB`: `discretization="zoh_euler"`), the skip `D`,
  the gate `SiLU(z)` and `out_proj`.
- `transformers` zeroes padded positions before `in_proj` and after the convolution;
  `MambaMixer` zeroes them before the convolution and also holds the state over them. With
  right padding the outputs at real positions are the same.
- `residual_in_fp32`: `transformers` keeps the residual stream in float32; keras_xf keeps it
  in the compute dtype. In float32 the two are the same; written checkpoints say
  `residual_in_fp32=False`, which computes as keras_xf does in every dtype.

`hidden_act` other than `"silu"` is refused (the gate is SiLU in `transformers` whatever it
says, while the convolution takes `hidden_act`). The initialisation settings
(`time_step_scale`, `time_step_init_scheme`, `time_step_floor`, `rescale_prenorm_residual`)
do not change the function and are not read; `time_step_min` and `time_step_max` set the
`MambaMixer`'s `dt_min` and `dt_max`.
"""

import math

from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.mixers.mamba_mixer import MambaMixer
from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.checkpoints.tensor_map import linear

ARCHITECTURES = ("MambaForCausalLM",)
MODEL_TYPES = {"mamba": "MambaForCausalLM"}
# `MambaConfig`'s defaults of the keys that a config.json may leave out.
DEFAULTS = {"state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": "auto",
            "use_bias": False, "use_conv_bias": True, "layer_norm_epsilon": 1e-5,
            "hidden_act": "silu", "time_step_min": 1e-3, "time_step_max": 1e-1}


def _setting(config, key):
    value = config.get(key)
    return DEFAULTS[key] if value is None else value


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    if _setting(config, "hidden_act") != "silu":
        raise ValueError("Mamba checkpoints with hidden_act other than 'silu' are not "
                         f"supported. Received: hidden_act={config.get('hidden_act')!r}")
    width, expand = int(config["hidden_size"]), int(_setting(config, "expand"))
    inner = config.get("intermediate_size")
    if inner is not None and int(inner) != expand * width:
        raise ValueError("Mamba's intermediate_size must be expand * hidden_size. Received: "
                         f"intermediate_size={inner}, expand={expand}, hidden_size={width}")
    rank = _setting(config, "time_step_rank")
    mixer = MambaMixer(
        state_size=int(_setting(config, "state_size")), expand=expand,
        conv_kernel=int(_setting(config, "conv_kernel")),
        dt_rank=math.ceil(width / 16) if rank == "auto" else int(rank),
        use_bias=bool(_setting(config, "use_bias")),
        use_conv_bias=bool(_setting(config, "use_conv_bias")),
        dt_min=float(_setting(config, "time_step_min")),
        dt_max=float(_setting(config, "time_step_max")),
    )
    block = TransformerBlock(mixer, None, normalization="rms_norm", norm_placement="pre",
                             epsilon=float(_setting(config, "layer_norm_epsilon")))
    return CausalLM(
        vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        hidden_dim=width, block=block, position="none",
        max_sequence_length=int(config.get("max_position_embeddings") or 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)), dtype=dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )


def _convolution(name, variable):
    """`conv1d.weight` `[E, 1, K]` (a grouped `torch.nn.Conv1d`) ↔ the depthwise kernel
    `[K, E]`; both correlate `x_{t−K+1} … x_t` with taps `0 … K − 1`."""
    return Entry([name], [variable], lambda a: [a[0][:, 0, :].T],
                 lambda a: [a[0].T[:, None, :]])


def _mixer_entries(prefix, mixer):
    entries = parts.dense(f"{prefix}.in_proj", mixer.input_projection)
    entries.append(_convolution(f"{prefix}.conv1d.weight", mixer.convolution.kernel))
    if mixer.convolution.bias is not None:
        entries.append(copy(f"{prefix}.conv1d.bias", mixer.convolution.bias))
    return entries + [
        linear(f"{prefix}.x_proj.weight", mixer.selection_kernel),
        linear(f"{prefix}.dt_proj.weight", mixer.dt_kernel),
        copy(f"{prefix}.dt_proj.bias", mixer.dt_bias),
        copy(f"{prefix}.A_log", mixer.a_log),
        copy(f"{prefix}.D", mixer.d),
    ] + parts.dense(f"{prefix}.out_proj", mixer.output_projection)


def tensor_map(model, config):
    backbone = model.backbone
    stack = backbone.transformer_stack
    entries = [copy("backbone.embeddings.weight", backbone.embeddings.token_embedding.embeddings)]
    for index, block in enumerate(stack.blocks):
        prefix = f"backbone.layers.{index}"
        entries += (parts.norm(f"{prefix}.norm", block.mixer_residual.norm)
                    + _mixer_entries(f"{prefix}.mixer", block.mixer))
    entries += parts.norm("backbone.norm_f", stack.output_norm)
    ignored = []
    entries += parts.output_projection(backbone, ignored)
    return TensorMap(entries, ignored)


def hf_config(model):
    """The `MambaConfig` of `model`, or a `ValueError` naming what Mamba cannot express."""
    backbone = model.backbone if isinstance(model, CausalLM) else None
    if backbone is None or backbone.position != "none":
        raise ValueError("Mamba is a CausalLM with position='none' and MambaMixer blocks.")
    if backbone.embedding_normalization is not None or backbone.embedding_scale:
        raise ValueError("Mamba has unscaled, unnormalised embeddings: "
                         "embedding_normalization=None, embedding_scale=False.")
    stack = backbone.transformer_stack
    block = stack.blocks[0]
    mixer = block.mixer
    fits = (
        type(block) is TransformerBlock and type(mixer) is MambaMixer
        and block.feedforward is None and block.cross_attention is None
        and block.norm_placement == "pre" and block.normalization == "rms_norm"
        and parts.has_one_template(stack)
    )
    if not fits:
        raise ValueError("Mamba needs pre-norm RMSNorm blocks of a MambaMixer without a "
                         "feedforward (TransformerBlock(MambaMixer(...), None, "
                         "normalization='rms_norm', norm_placement='pre')).")
    return {
        "architectures": list(ARCHITECTURES), "model_type": "mamba",
        "vocab_size": backbone.vocabulary_size, "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": stack.num_layers, "state_size": mixer.state_size,
        "expand": mixer.expand, "intermediate_size": mixer.inner_dim,
        "conv_kernel": mixer.conv_kernel, "time_step_rank": mixer.rank,
        "use_bias": mixer.use_bias, "use_conv_bias": mixer.use_conv_bias,
        "hidden_act": "silu", "layer_norm_epsilon": block.epsilon,
        "time_step_min": mixer.dt_min, "time_step_max": mixer.dt_max,
        "residual_in_fp32": False, "tie_word_embeddings": backbone.tie_embeddings,
        "pad_token_id": model.pad_token_id,
    }
