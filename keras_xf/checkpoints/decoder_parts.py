"""Tensor entries shared by the checkpoint families: norms, attention and feedforwards of
a keras_xf `TransformerBlock`."""

import keras

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.checkpoints.tensor_map import linear
from keras_xf.checkpoints.tensor_map import transposed

# Hugging Face `hidden_act` / `activation_function` names and the FeedForward activation
# that computes the same function.
ACTIVATIONS = {
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
}
GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}
# The inverse, for writing: the name every family's loader reads back to the same function.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def activation(config, key, gated=False):
    """The FeedForward activation of a Hugging Face activation name."""
    name = config.get(key)
    if name not in ACTIVATIONS or (gated and ACTIVATIONS[name] not in GATED):
        known = sorted(n for n in ACTIVATIONS if not gated or ACTIVATIONS[n] in GATED)
        raise ValueError(f"{key}={name!r} has no keras_xf FeedForward activation. Known: {known}")
    return GATED[ACTIVATIONS[name]] if gated else ACTIVATIONS[name]


def norm(prefix, layer):
    """`{prefix}.weight` (and `.bias`) of a Keras `LayerNormalization` or `RMSNormalization`."""
    if isinstance(layer, keras.layers.LayerNormalization):
        entries = [copy(f"{prefix}.weight", layer.gamma)]
        if layer.center:
            entries.append(copy(f"{prefix}.bias", layer.beta))
        return entries
    return [copy(f"{prefix}.weight", layer.scale)]


def dense(prefix, layer, input_axes=1):
    """`{prefix}.weight` `[out, in]` (and `.bias`) of a `torch.nn.Linear`."""
    entries = [linear(f"{prefix}.weight", layer.kernel, input_axes)]
    if getattr(layer, "bias", None) is not None:
        entries.append(copy(f"{prefix}.bias", layer.bias, flat=True))
    return entries


def attention(prefix, mha, names=("q_proj", "k_proj", "v_proj", "o_proj")):
    """Separate query, key, value and output `Linear`s of a `MultiHeadAttention`."""
    layers = (mha.query_dense, mha.key_dense, mha.value_dense)
    entries = [e for name, layer in zip(names, layers) for e in dense(f"{prefix}.{name}", layer)]
    return entries + dense(f"{prefix}.{names[3]}", mha.output_dense, input_axes=2)


def gated_feedforward(prefix, ffn, names=("gate_proj", "up_proj", "down_proj")):
    """`down(act(gate(x)) ⊙ up(x))`: keras_xf's `gate`, `hidden` and `output` projections."""
    return (dense(f"{prefix}.{names[0]}", ffn.gate_dense)
            + dense(f"{prefix}.{names[1]}", ffn.hidden_dense)
            + dense(f"{prefix}.{names[2]}", ffn.output_dense))


def is_plain_attention(mha, position=False, pattern=False, biases=False):
    """`mha` is a `MultiHeadAttention` with none of keras_xf's score hooks (a position hook,
    an attention pattern or additive score biases allowed when asked, for the caller to
    check) and the default scale and query/key width."""
    return (
        type(mha) is MultiHeadAttention and (position or mha.position is None)
        and (pattern or mha.pattern is None) and (biases or not mha.biases)
        and mha.multiplier is None
        and mha.guided_heads is None and mha.qk_dim is None and mha.scale is None
    )


def has_one_template(stack):
    """`stack` (a `TransformerStack`) repeats one block template: not a hybrid of several,
    whose layers a family's one tensor map per layer cannot describe. Read from the stack's
    config, whose `block` is the template or the list of them."""
    templates = stack.get_config()["block"]
    return not isinstance(templates, list) or len(templates) == 1


def output_projection(backbone, ignored):
    """`lm_head.weight` `[V, d]` ↔ the untied output projection `[d, V]`; with tied
    embeddings there is nothing to load and the tensor, when a writer kept it, is added to
    the `ignored` patterns."""
    if backbone.tie_embeddings:
        ignored.append(r"lm_head\.weight")
        return []
    # `reverse_kernel`: the variable, or with LoRA the merged matrix (written).
    return [transposed("lm_head.weight", backbone.embeddings.token_embedding.reverse_kernel)]
