"""T5 (`T5ForConditionalGeneration`: T5 1.0 with ReLU, T5 1.1 with gated GELU) ↔ a pre-norm
RMSNorm `Seq2SeqLM`.

T5's layers (Raffel et al., cited in survey §4.1.3): RMSNorm scales without bias or mean
subtraction; attention without the `1/√d_h` scale and without biases; one bucketed
relative-position bias per stack, `α_ij = Softmax(q_i·k_j + b_{h, bucket(j − i)})`
(bidirectional buckets in the encoder, causal ones in the decoder; T5 keeps the table in
layer 0 and passes the bias to every layer: `share_score_biases=True`), none in
cross-attention; a feedforward `wo(relu(wi x))` (1.0) or `wo(gelu_tanh(wi_0 x) ⊙ wi_1 x)`
(1.1, `"gated-gelu"`); one embedding for encoder and decoder; final norms on both stacks.
With tied output embeddings (1.0) the decoder states are rescaled by `d^-0.5` before the
output projection (`logit_scale`); T5 1.1 checkpoints carry their own `lm_head.weight`.
Decoding starts from `decoder_start_token_id` (the padding id, 0).

`transformers` 5 always ties `lm_head` to `shared` and writes no `lm_head.weight`; it
keeps the rescale in `scale_decoder_outputs` (`tie_word_embeddings` of older configs).
"""

import math

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.attention.relative_position_bias import RelativePositionBias
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.checkpoints import decoder_parts as parts
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.checkpoints.tensor_map import transposed
from keras_xf.models.generative.seq2seq_lm import Seq2SeqLM

ARCHITECTURES = ("T5ForConditionalGeneration",)
MODEL_TYPES = {"t5": "T5ForConditionalGeneration"}
# T5's `feed_forward_proj` and the FeedForward activation computing it (`gated-gelu` is the
# tanh form, `gelu_new`, in every T5 1.1 checkpoint).
FEEDFORWARDS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gated-gelu": "geglu_tanh", "gated-gelu_new": "geglu_tanh",
                "gated-silu": "swiglu"}
HF_FEEDFORWARDS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new",
                   "geglu_tanh": "gated-gelu", "swiglu": "gated-silu"}


def scales_outputs(config):
    """Whether the decoder states are rescaled by `d^-0.5` before the output projection."""
    if "scale_decoder_outputs" in config:
        return bool(config["scale_decoder_outputs"])
    return config.get("tie_word_embeddings", True) is not False


def _attention(config, bias=None):
    return MultiHeadAttention(config["num_heads"], head_dim=config["d_kv"], use_bias=False,
                              scale=1.0, biases=None if bias is None else [bias])


def _bias(config, bidirectional):
    return RelativePositionBias(num_buckets=config.get("relative_attention_num_buckets", 32),
                                max_distance=config.get("relative_attention_max_distance", 128),
                                bidirectional=bidirectional)


def build(config, dtype=None, untied=False):
    """The `Seq2SeqLM` of a T5 config; `untied=True` gives it its own output projection
    (a checkpoint with an `lm_head.weight`)."""
    projection = config.get("feed_forward_proj", "relu")
    if projection not in FEEDFORWARDS:
        raise ValueError(f"feed_forward_proj={projection!r} has no keras_xf FeedForward "
                         f"activation. Known: {sorted(FEEDFORWARDS)}")
    epsilon = config.get("layer_norm_epsilon", 1e-6)

    def block(bidirectional, cross_attention=None):
        return TransformerBlock(
            _attention(config, _bias(config, bidirectional)),
            FeedForward(config["d_ff"], activation=FEEDFORWARDS[projection], use_bias=False),
            cross_attention=cross_attention, normalization="rms_norm", norm_placement="pre",
            epsilon=epsilon,
        )

    pad = config.get("pad_token_id")
    pad = 0 if pad is None else pad
    start = config.get("decoder_start_token_id")
    return Seq2SeqLM(
        vocabulary_size=config["vocab_size"], num_layers=config["num_layers"],
        num_decoder_layers=config.get("num_decoder_layers") or config["num_layers"],
        hidden_dim=config["d_model"], block=block(True),
        decoder_block=block(False, cross_attention=_attention(config)),
        position="none", max_sequence_length=config.get("n_positions", 512),
        share_embeddings=True, tie_embeddings=not untied, share_score_biases=True,
        pad_token_id=pad, start_token_id=pad if start is None else start,
        logit_scale=config["d_model"] ** -0.5 if scales_outputs(config) else 1.0, dtype=dtype,
    )


def _feedforward(prefix, ffn):
    if ffn.gate_dense is not None:
        return parts.gated_feedforward(prefix, ffn, names=("wi_0", "wi_1", "wo"))
    return parts.dense(f"{prefix}.wi", ffn.hidden_dense) + parts.dense(f"{prefix}.wo",
                                                                       ffn.output_dense)


def tensor_map(model, config):
    """Every tensor of a T5 checkpoint."""
    backbone = model.backbone
    names = ("q", "k", "v", "o")
    entries = [copy("shared.weight", backbone.decoder_embeddings.token_embedding.embeddings)]
    for stack_name, stack in (("encoder", backbone.encoder), ("decoder", backbone.decoder)):
        for index, block in enumerate(stack.blocks):
            prefix = f"{stack_name}.block.{index}.layer"
            entries += (parts.norm(f"{prefix}.0.layer_norm", block.mixer_residual.norm)
                        + parts.attention(f"{prefix}.0.SelfAttention", block.mixer, names))
            if index == 0:
                entries.append(copy(f"{prefix}.0.SelfAttention.relative_attention_bias.weight",
                                    block.mixer.biases[0].embeddings))
            feedforward = 1
            if block.cross_attention_residual is not None:
                feedforward = 2
                entries += (parts.norm(f"{prefix}.1.layer_norm",
                                       block.cross_attention_residual.norm)
                            + parts.attention(f"{prefix}.1.EncDecAttention",
                                              block.cross_attention, names))
            entries += (parts.norm(f"{prefix}.{feedforward}.layer_norm",
                                   block.feedforward_residual.norm)
                        + _feedforward(f"{prefix}.{feedforward}.DenseReluDense",
                                       block.feedforward))
        entries += parts.norm(f"{stack_name}.final_layer_norm", stack.output_norm)
    ignored = [r"(encoder|decoder)\.embed_tokens\.weight",
               r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"]
    if backbone.tie_embeddings:
        ignored.append(r"lm_head\.weight")
    else:
        entries.append(transposed("lm_head.weight",
                                  backbone.decoder_embeddings.token_embedding.reverse_kernel))
    return TensorMap(entries, ignored)


def build_from_folder(folder, dtype=None):
    """The `Seq2SeqLM` of a T5 checkpoint folder: its own output projection when the folder
    holds an `lm_head.weight` that is not the embedding (T5 1.1), tied otherwise."""
    config = folder.config
    untied = "lm_head.weight" in folder and config.get("tie_word_embeddings") is False
    return build(config, dtype, untied=untied)


def _check(model):
    backbone = model.backbone if isinstance(model, Seq2SeqLM) else None
    if backbone is None or backbone.position != "none" or not backbone.share_embeddings \
            or not backbone.share_score_biases or backbone.embedding_scale:
        raise ValueError("T5 is a Seq2SeqLM with position='none', share_embeddings=True, "
                         "share_score_biases=True and embedding_scale=False.")
    encoder, decoder = backbone.encoder, backbone.decoder
    blocks = [encoder.blocks[0], decoder.blocks[0]]
    ffn = blocks[0].feedforward
    heads, head_dim = blocks[0].mixer.num_heads, blocks[0].mixer.head_dim
    buckets = None
    for stack, block, bidirectional in ((encoder, blocks[0], True), (decoder, blocks[1], False)):
        mixers = [block.mixer] + ([block.cross_attention] if not bidirectional else [])
        bias = block.mixer.biases[0] if len(block.mixer.biases) == 1 else None
        fits = (
            parts.has_one_template(stack) and type(block) is TransformerBlock
            and block.norm_placement == "pre" and block.normalization == "rms_norm"
            and stack.output_norm is not None
            and (block.cross_attention is None) == bidirectional
            and type(bias) is RelativePositionBias and bias.bidirectional == bidirectional
            and all(type(m) is MultiHeadAttention and not m.use_bias and m.scale == 1.0
                    and m.num_heads == heads and m.head_dim == head_dim
                    and m.num_key_value_heads == heads and m.position is None
                    and m.pattern is None and m.multiplier is None and m.qk_dim is None
                    and m.guided_heads is None for m in mixers)
            and (bidirectional or not block.cross_attention.biases)
            and type(block.feedforward) is FeedForward and not block.feedforward.use_bias
            and block.feedforward.activation == ffn.activation
            and block.feedforward.hidden_dim == ffn.hidden_dim
            and block.epsilon == blocks[0].epsilon
        )
        if not fits:
            raise ValueError(
                "T5 needs pre-norm rms_norm blocks with final norms, attention without biases "
                "with scale=1.0 and one RelativePositionBias (bidirectional in the encoder, "
                "causal in the decoder), cross-attention without biases, and bias-free "
                "feedforwards.")
        settings = (bias.num_buckets, bias.max_distance)
        if buckets is not None and settings != buckets:
            raise ValueError("T5 uses the same num_buckets and max_distance in both stacks.")
        buckets = settings
    if ffn.activation not in HF_FEEDFORWARDS:
        raise ValueError(f"T5 has no feed_forward_proj for activation={ffn.activation!r}. "
                         f"Known: {sorted(HF_FEEDFORWARDS)}")
    return backbone, blocks[0], buckets


def hf_config(model):
    """The T5 config of `model`, or a `ValueError` naming what T5 does not express."""
    backbone, block, (buckets, distance) = _check(model)
    d = backbone.hidden_dim
    scaled = math.isclose(model.logit_scale, d ** -0.5, rel_tol=1e-9)
    if not scaled and model.logit_scale != 1.0:
        raise ValueError(f"T5 scales logits by d^-0.5 or not at all. Received: "
                         f"logit_scale={model.logit_scale}")
    if not backbone.tie_embeddings:
        raise ValueError("transformers' T5 ties lm_head to the shared embedding: an untied "
                         "output projection cannot be written.")
    ffn = block.feedforward
    mha = block.mixer
    return {
        "architectures": list(ARCHITECTURES), "model_type": "t5",
        "vocab_size": backbone.vocabulary_size, "d_model": d, "d_kv": mha.head_dim,
        "d_ff": ffn.hidden_dim, "num_layers": backbone.encoder.num_layers,
        "num_decoder_layers": backbone.decoder.num_layers, "num_heads": mha.num_heads,
        "relative_attention_num_buckets": buckets, "relative_attention_max_distance": distance,
        "dropout_rate": 0.0, "layer_norm_epsilon": block.epsilon,
        "feed_forward_proj": HF_FEEDFORWARDS[ffn.activation],
        "is_encoder_decoder": True, "pad_token_id": model.pad_token_id,
        "decoder_start_token_id": model.start_token_id, "eos_token_id": 1,
        "scale_decoder_outputs": scaled, "tie_word_embeddings": scaled,
    }
