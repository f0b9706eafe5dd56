"""Shared by the checkpoint tests: perturbed reference models, a right-padded batch, logits
of both libraries, LoRA adapters drawn at random, and a rewrite of a folder's tensors."""

import os

import keras
import numpy as np
import transformers

VOCAB, LENGTH = 61, 12

ROPE_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}
CONFIGS = {  # name: a `transformers` config of a tiny causal LM
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4, n_positions=32, bos_token_id=1,
        eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5),
    # Tied embeddings, Llama 3 frequency rescaling, and a head width of its own.
    "llama3_tied": lambda: transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=12, max_position_embeddings=64,
        rope_parameters=ROPE_LLAMA3, tie_word_embeddings=True),
    # A window of 4 keys: the 12-token batch reaches well past it.
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, sliding_window=4,
        max_position_embeddings=64),
    # Biases on the query, key and value projections, none on the output.
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
    # Tied embeddings, one key/value head, a head width (12) apart from hidden / heads, and
    # √24 as the embedding normaliser (not exact in bfloat16).
    "gemma": lambda: transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=12, max_position_embeddings=64),
    # Untied, biased attention and another RoPE base.
    "gemma_untied": lambda: transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True, tie_word_embeddings=False, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    # Four experts, two per token, and Mistral's window of 4 keys.
    "mixtral": lambda: transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64),
    # Three experts, one per token (its gate renormalised to 1), tied embeddings.
    "mixtral_top1": lambda: transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=12, num_local_experts=3,
        num_experts_per_tok=1, tie_word_embeddings=True, max_position_embeddings=64),
    # ALiBi with four heads (a power of two), tied embeddings.
    "bloom": lambda: transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=16, n_layer=2, n_head=4),
    # Six heads (not a power of two: the slopes of 4 heads, then every other slope of 8), an
    # untied output projection and another epsilon.
    "bloom_6_heads_untied": lambda: transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=24, n_layer=2, n_head=6, tie_word_embeddings=False,
        layer_norm_epsilon=1e-6),
    # A state of 4, a convolution of 3 taps, the step rank "auto" (⌈24 / 16⌉ = 2), a
    # convolution bias and tied embeddings (greedy generation varies its tokens).
    "mamba": lambda: transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=24, state_size=4, num_hidden_layers=2, expand=2,
        conv_kernel=3),
    # Biased projections, no convolution bias, a step rank of 3, an untied output projection
    # and another epsilon.
    "mamba_biased_untied": lambda: transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=16, state_size=3, num_hidden_layers=2, expand=1,
        conv_kernel=4, time_step_rank=3, use_bias=True, use_conv_bias=False,
        tie_word_embeddings=False, layer_norm_epsilon=1e-6),
}


def perturbed(model, seed=0):
    """`model` (a `transformers` model) with every parameter moved by `N(0, 0.2²)`: no bias
    is zero and no norm scale one, so a tensor mapped to the wrong place shows. Eval mode."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return model.eval()


def causal_reference(name, seed=0):
    """A perturbed `AutoModelForCausalLM` of `CONFIGS[name]`."""
    import torch

    torch.manual_seed(seed)
    return perturbed(transformers.AutoModelForCausalLM.from_config(CONFIGS[name]()), seed)


def batch(seed=0, vocabulary_size=VOCAB, length=LENGTH):
    """Token ids `[2, length]`; the second row is right-padded after 7 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocabulary_size, size=(2, length)).astype("int32")
    mask = np.ones((2, length), "int32")
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    return ids, mask


def reference_logits(model, ids, mask):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long))
    return out.logits.float().numpy()


def keras_logits(model, ids, mask):
    return keras.ops.convert_to_numpy(model({"token_ids": ids, "padding_mask": mask}))


def assert_logits_equal(actual, expected, mask, atol=1e-4):
    """Equal at the real (unpadded) positions."""
    real = mask.astype(bool)
    np.testing.assert_allclose(actual[real], expected[real], atol=atol, rtol=1e-4)


def with_random_adapters(model, seed=0):
    """`model` with every LoRA adapter `B` drawn from `N(0, 0.3²)` (they start at zero), so
    the adapters' update shows in the logits."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_variables:
        if variable.path.endswith("lora_kernel_b"):
            variable.assign(rng.normal(0, 0.3, size=variable.shape).astype("float32"))
    return model


def rewrite(folder, change):
    """Rewrites the folder's single safetensors file with `change(tensors)` applied."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)
