"""GGUF files the tests write (nothing is downloaded): a tiny random `transformers` model
(every parameter perturbed) written as llama.cpp's `convert_hf_to_gguf.py` writes one (its
tensor names, Llama's rotary permutation of q/k rows, Gemma's norm scales stored as `1 + w`),
with the byte-level BPE tokenizer of `tests/preprocessing/folders.py` in the metadata."""

import json
import pathlib

import numpy as np

from tests.preprocessing.folders import BOS
from tests.preprocessing.folders import CHAT_TEMPLATE
from tests.preprocessing.folders import EOS
from tests.preprocessing.folders import PAD
from tests.preprocessing.folders import SPECIAL
from tests.preprocessing.folders import VOCABULARY_SIZE
from tests.preprocessing.folders import train_tokenizer

# Per HF name suffix: the llama.cpp name suffix.
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma": "gemma"}


def tiny_model(model_type, intermediate_size=64, tie=False, seed=0,
               vocabulary_size=VOCABULARY_SIZE):
    """A tiny perturbed `*ForCausalLM` of `model_type` (hidden 32, 2 layers, 4 heads and 2
    key/value heads of 8) on the tokenizer's vocabulary."""
    import torch
    import transformers

    from tests.checkpoints.hf_checks import perturbed

    torch.manual_seed(seed)
    kinds = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
             "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
             "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM)}
    config_class, model_class = kinds[model_type]
    config = config_class(
        vocab_size=vocabulary_size, hidden_size=32, intermediate_size=intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=tie,
        bos_token_id=0, eos_token_id=1, pad_token_id=2)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 5000.0}
    return perturbed(model_class(config).eval(), seed=seed)


def _permute(weights, heads):
    """llama.cpp's `LlamaModel.permute`: each head's rows from halves-first (Hugging Face's
    rotary layout) to interleaved pairs (GGML's)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_tensors(model):
    """`{llama.cpp name: float32 array}` of a `transformers` model, as convert_hf_to_gguf.py
    turns its state dict."""
    config = model.config
    kind = ARCHITECTURES[config.model_type]
    tensors = {}
    for name, value in model.state_dict().items():
        array = value.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        else:
            _, _, index, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            gguf_name = f"blk.{index}.{LAYER_NAMES[module]}.{suffix}"
        if kind == "llama" and ".attn_q." in gguf_name:
            array = _permute(array, config.num_attention_heads)
        elif kind == "llama" and ".attn_k." in gguf_name:
            array = _permute(array, config.num_key_value_heads)
        if kind == "gemma" and gguf_name.endswith("norm.weight"):
            array = array + 1.0
        tensors[gguf_name] = np.ascontiguousarray(array, dtype=np.float32)
    return tensors


def _tokenizer_metadata(writer):
    """The byte-level BPE tokenizer as llama.cpp stores a `gpt2` vocabulary."""
    tokenizer = json.loads(train_tokenizer(padding=False).to_str())
    vocabulary = tokenizer["model"]["vocab"]
    tokens = sorted(vocabulary, key=vocabulary.get)
    assert [vocabulary[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(BOS))
    writer.add_eos_token_id(tokens.index(EOS))
    writer.add_pad_token_id(tokens.index(PAD))
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)


# A SentencePiece BPE vocabulary as llama.cpp stores Llama 2's and Mistral's (`llama`): no
# merges, scores giving the merge order, the 256 byte tokens for byte fallback.
PIECES = ["\u2581", "t", "o", "e", "b", "h", "a", "r", "n", "i", "s", "q", "u", ",", ":",
          "\u2581t", "\u2581to", "\u2581b", "\u2581be", "\u2581o", "\u2581or", "\u2581n",
          "\u2581no", "\u2581not", "\u2581th", "\u2581tha", "\u2581that", "\u2581the",
          "\u2581i", "\u2581is", "\u2581q", "\u2581qu", "es", "\u2581To", "T"]
SENTENCEPIECE_TOKENS = (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
                        + PIECES)


def _sentencepiece_metadata(writer):
    tokens = SENTENCEPIECE_TOKENS
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(PIECES))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(PIECES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(True)


def write_gguf(model, path, types=None, tokenizer="bpe", name="tiny"):
    """Writes `model` as a GGUF file at `path`; `types(name, array)` gives each tensor's
    `gguf.GGMLQuantizationType` (float32 when `None`); `tokenizer`: `"bpe"` (the
    byte-level BPE of `tests/preprocessing/folders.py`), `"sentencepiece"`
    (`SENTENCEPIECE_TOKENS`) or `None`. Returns `path`."""
    import gguf

    config = model.config
    kind = ARCHITECTURES[config.model_type]
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if tokenizer == "bpe":
        _tokenizer_metadata(writer)
    elif tokenizer == "sentencepiece":
        _sentencepiece_metadata(writer)
    for tensor_name, array in gguf_tensors(model).items():
        kind_of = gguf.GGMLQuantizationType.F32 if types is None else types(tensor_name, array)
        if array.ndim == 1 or kind_of == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tensor_name, array)
        else:
            writer.add_tensor(tensor_name, random_blocks(array, kind_of)
                              if kind_of in _k_types() else
                              gguf.quants.quantize(array, kind_of), raw_dtype=kind_of)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _k_types():
    import gguf

    return (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K)


def random_blocks(array, kind):
    """K-quant blocks (which the gguf package dequantises but does not write) for `array`'s
    shape: random bytes with the block scales set to small float16 values, so the weights
    have the array's scale. Both readers dequantise the same bytes."""
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    rows, columns = array.shape
    rng = np.random.default_rng(rows * columns)
    blocks = rng.integers(0, 256, (rows, columns // block_size, type_size), dtype=np.uint8)
    scale = np.array([0.02 / 16], np.float16).view(np.uint8)
    if kind == gguf.GGMLQuantizationType.Q4_K:  # d, dmin, 12 bytes of scales, 128 of quants
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = np.array([0.01 / 16], np.float16).view(np.uint8)
    else:  # Q6_K: 128 low, 64 high, 16 int8 scales, then d
        blocks[..., -2:] = scale
    return blocks.reshape(rows, -1)
