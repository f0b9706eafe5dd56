"""A checkpoint folder's tokenizer (`tokenizer.json`, through the `tokenizers` library):
from a string prompt to generated text, equal to transformers' pipeline."""

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import HuggingFaceTokenizer  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402

TEXT = ["To be, or not to be, that is the question:",
        "Whether 'tis nobler in the mind to suffer",
        "The slings and arrows of outrageous fortune"] * 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny GPT-2 checkpoint with a byte-level BPE tokenizer trained on a few lines."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(TEXT, trainer)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_embd=16, n_layer=2,
                                     n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    path = tmp_path_factory.mktemp("gpt2_with_tokenizer")
    model.save_pretrained(path)
    bpe.save(str(path / "tokenizer.json"))
    return path, model


def test_round_trip_and_vocabulary(folder):
    tokenizer = HuggingFaceTokenizer(folder[0])
    ids = tokenizer(TEXT[:2])
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids[0])
    assert tokenizer.detokenize(ids) == TEXT[:2]
    assert tokenizer.detokenize(tokenizer(TEXT[0])) == TEXT[0]
    assert tokenizer.detokenize(np.array(ids[0])) == TEXT[0]
    assert tokenizer.token_to_id("<|endoftext|>") == 0 and tokenizer.id_to_token(0) == "<|endoftext|>"
    assert tokenizer.vocabulary_size == 300


def test_string_prompt_to_generated_text_equals_transformers(folder):
    path, reference = folder
    tokenizer = HuggingFaceTokenizer(path)
    model = from_huggingface(path)
    prompts = ["To be, or", "The slings and arrows"]
    generated = model.generate(tokenizer(prompts), max_length=12, stop_token_ids=None)
    texts = tokenizer.detokenize(generated)
    reference_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    for prompt, text in zip(prompts, texts):
        ids = reference_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = reference.generate(ids, max_length=12, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)
        assert text == reference_tokenizer.decode(out[0]) and text.startswith(prompt)


def test_a_folder_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        HuggingFaceTokenizer(tmp_path)
