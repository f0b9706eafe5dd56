"""Mixtral (`MixtralForCausalLM`) ↔ a pre-norm RMSNorm `CausalLM` with rotary grouped-query
attention (Mistral's sliding window when set) and a sparse `MixtureOfExperts` feedforward.

Each layer's `block_sparse_moe` is `y = Σ_{i∈π} g_i · w2_i(SiLU(w1_i x) ⊙ w3_i x)` with
`g = Softmax(x W_gate)` kept for the top `k` experts `π` and renormalised to sum to one
(survey §4.4, §5.6): `MixtureOfExperts(activation="swiglu", router_order="softmax_then_topk",
normalize_top_k=True)` without biases, whose `expert_kernel_gate`, `expert_kernel_in` and
`expert_kernel_out` stack the experts' `w1`, `w3` and `w2`. The checkpoint stores one
`[out, in]` tensor per expert (`experts.{i}.w1.weight`, ...), as `save_pretrained` writes it;
`transformers` fuses them into `experts.gate_up_proj` and `experts.down_proj` in memory only.

Dispatch is dropless (`capacity_factor=None`): Mixtral drops no token. Mixtral routes padding
tokens like real ones (`route_padding=True`), so padded positions carry the same values too.
Training-only settings differ: the load-balancing loss is added (with `router_aux_loss_coef`)
only when `output_router_logits` is set, per layer rather than over all layers' tokens at once,
and `router_jitter_noise` (a multiplicative input noise in training) is not applied.
"""

from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.mixture_of_experts import MixtureOfExperts
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints import llama
from keras_xf.checkpoints.tensor_map import linear
from keras_xf.checkpoints.tensor_map import stacked

ARCHITECTURES = ("MixtralForCausalLM",)
MODEL_TYPES = {"mixtral": "MixtralForCausalLM"}


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    balance = 0.0
    if config.get("output_router_logits"):
        balance = config.get("router_aux_loss_coef", 0.001)
    experts = MixtureOfExperts(
        config["num_local_experts"], config["intermediate_size"],
        top_k=config.get("num_experts_per_tok", 2),
        activation=parts.activation(config, "hidden_act", gated=True),
        capacity_factor=None, router_order="softmax_then_topk", normalize_top_k=True,
        router_bias=False, use_bias=False, load_balance_weight=balance, z_loss_weight=0.0,
        route_padding=True,
    )
    block = TransformerBlock(
        llama.rotary_attention(config, use_bias=False), experts,
        normalization="rms_norm", norm_placement="pre", epsilon=config.get("rms_norm_eps", 1e-5),
    )
    return llama.decoder_lm(config, block, dtype)


def _experts(prefix, moe):
    """`{prefix}.block_sparse_moe.gate.weight [M, d]` and each expert's `w1`, `w3`, `w2`."""
    prefix = f"{prefix}.block_sparse_moe"

    def names(weight):
        return [f"{prefix}.experts.{i}.{weight}.weight" for i in range(moe.num_experts)]

    # `kernel`: the variable, or with LoRA enabled the merged `W + (α/r)·A·B` (written).
    return [linear(f"{prefix}.gate.weight", moe.router.kernel),
            stacked(names("w1"), moe.experts_gate.kernel),
            stacked(names("w3"), moe.experts_in.kernel),
            stacked(names("w2"), moe.experts_out.kernel)]


def tensor_map(model, config):
    return llama.tensor_map(model, config, feedforward=_experts)


def hf_config(model):
    """The `MixtralConfig` of `model`, or a `ValueError` naming what Mixtral cannot express."""
    backbone, block = llama.check_decoder(model)
    mha, moe = block.mixer, block.feedforward
    fits = (
        type(moe) is MixtureOfExperts and moe.activation == "swiglu" and not moe.use_bias
        and not moe.router_bias and not moe.slices and not moe.num_shared_experts
        and moe.capacity_factor is None and not mha.use_bias and not mha.output_bias
        and (moe.normalize_top_k or moe.router_order == "topk_then_softmax")
    )
    if not fits:
        raise ValueError("Mixtral needs a dropless MixtureOfExperts (capacity_factor=None) of "
                         "SwiGLU experts with renormalised top-k gates and no biases, after "
                         "attention without biases.")
    config = llama.decoder_config(model, backbone, block, moe.intermediate_dim)
    config.pop("attention_bias")
    config.update(
        architectures=list(ARCHITECTURES), model_type="mixtral", hidden_act="silu",
        num_local_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
        output_router_logits=moe.load_balance_weight > 0,
        router_aux_loss_coef=moe.load_balance_weight or 0.001, router_jitter_noise=0.0,
        sliding_window=None if mha.pattern is None else mha.pattern.window_left + 1,
    )
    return config
