"""A stand-in Hugging Face checkpoint shared by the examples: a small random Llama and a
byte-level BPE tokenizer trained on a text, written as `save_pretrained` would leave them
(this needs `transformers` and `tokenizers`; nothing is downloaded)."""

import os


def write_stand_in(folder, text, vocabulary_size=1024, hidden_dim=128, intermediate_dim=256,
                   num_layers=2, num_heads=4, num_key_value_heads=2, characters=400_000,
                   seed=0):
    """Writes `config.json`, the safetensors weights and `tokenizer.json` into `folder`: a
    `LlamaForCausalLM` of the given sizes with random weights drawn from `seed`, and a BPE
    tokenizer of `vocabulary_size` entries (`<|endoftext|>` first, the start and end id)
    trained on the first `characters` characters of `text`."""
    import tokenizers
    import torch
    import transformers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(
        [text[i:i + 2000] for i in range(0, characters, 2000)],
        tokenizers.trainers.BpeTrainer(
            vocab_size=vocabulary_size, special_tokens=["<|endoftext|>"],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()),
    )
    config = transformers.LlamaConfig(
        vocab_size=bpe.get_vocab_size(), hidden_size=hidden_dim,
        intermediate_size=intermediate_dim, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_key_value_heads,
        max_position_embeddings=512, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    bpe.save(os.path.join(folder, "tokenizer.json"))
