"""Gemma (`GemmaForCausalLM`) ↔ a pre-norm `CausalLM` with rotary grouped-query attention, a
gated tanh-GELU feedforward, RMSNorm scales stored as `1 + w`, and embeddings scaled by `√d`.

Gemma keeps Llama's tensor names (`llama.tensor_map`); what differs is expressed by general
options of the layers and models:
- `GemmaRMSNorm` computes `h / √(mean(h²) + ε) ⊙ (1 + w)` in float32 and stores `w`:
  `normalization="offset_rms_norm"` (`OffsetRMSNormalization`, whose variable is `w`).
- The feedforward is `down(GELU_tanh(gate(x)) ⊙ up(x))`: `FeedForward(activation="geglu_tanh")`
  (Gemma reads the legacy `hidden_act="gelu"` as the tanh form too, as `transformers` does).
- The token embeddings are multiplied by `√hidden_size` cast to the compute dtype:
  `CausalLM(embedding_scale=True)`.
- `head_dim` is its own setting (256 in the released models), and the output projection is
  tied to the embeddings unless `tie_word_embeddings` is false.
"""

from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints import llama

ARCHITECTURES = ("GemmaForCausalLM",)
MODEL_TYPES = {"gemma": "GemmaForCausalLM"}
tensor_map = llama.tensor_map


def _activation(config):
    name = config.get("hidden_act", "gelu_pytorch_tanh")
    # GemmaConfig turns the legacy "gelu" of the released configs into the tanh form.
    name = "gelu_pytorch_tanh" if name == "gelu" else name
    return parts.activation({"hidden_act": name}, "hidden_act", gated=True)


def build_from_folder(folder, dtype=None):
    """`build` on the folder's config: the model does not depend on the tensors present."""
    return build(folder.config, dtype=dtype)


def build(config, dtype=None):
    if config.get("use_bidirectional_attention"):
        raise ValueError("Gemma checkpoints with use_bidirectional_attention=True are not "
                         "supported (keras_xf reads the causal Gemma).")
    block = TransformerBlock(
        llama.rotary_attention(config),
        FeedForward(config["intermediate_size"], activation=_activation(config),
                    use_bias=False),
        normalization="offset_rms_norm", norm_placement="pre",
        epsilon=config.get("rms_norm_eps", 1e-6),
    )
    return llama.decoder_lm(config, block, dtype, tie_embeddings=True, embedding_scale=True)


def hf_config(model):
    """The `GemmaConfig` of `model`, or a `ValueError` naming what Gemma cannot express."""
    backbone, block = llama.check_decoder(model, normalization="offset_rms_norm",
                                          embedding_scale=True, pattern=False)
    mha, ffn = block.mixer, block.feedforward
    if type(ffn) is not FeedForward or ffn.activation != "geglu_tanh" or ffn.use_bias:
        raise ValueError("Gemma needs a gated tanh-GELU feedforward (activation='geglu_tanh') "
                         "without biases.")
    if mha.use_bias != mha.output_bias:
        raise ValueError("Gemma has biases in all four attention projections or in none.")
    config = llama.decoder_config(model, backbone, block, ffn.hidden_dim)
    config.update(architectures=list(ARCHITECTURES), model_type="gemma",
                  hidden_act="gelu_pytorch_tanh")
    return config
